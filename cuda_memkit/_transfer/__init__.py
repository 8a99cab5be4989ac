"""Moving bytes: ``copy``/``copy_async``, ``copy_batch`` and staged pageable copies."""
