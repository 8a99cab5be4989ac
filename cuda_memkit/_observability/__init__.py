"""Observing memory: events, statistics, tracking, reports and the leak report."""
