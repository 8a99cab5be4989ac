/* Block copies for cuda_memkit's copy_batch (see docs/transfers.md, "The kernel path").
 *
 * Compiled to PTX at development time by scripts/build_kernels.py (NVRTC,
 * compute_75); the PTX beside this file is what the package loads at run time
 * with cuModuleLoadData. Plain C: no headers, nothing NVRTC does not define.
 *
 * Block i copies size(i) bytes from src_base + src_off[i] to
 * dst_base + dst_off[i], where size(i) is sizes[i], or `size` for every block
 * when `sizes` is NULL. The blocks neither overlap each other's destinations
 * nor any source (the library checks that before launching), so they may be
 * copied in any order. Either side may be device memory or pinned host memory
 * read or written through its device-mapped address.
 *
 * Work split: a group of `lanes` threads (32, 64, 128 or 256; a power of two
 * dividing the CTA) copies one block at a time, the groups striding over the
 * blocks across the whole grid. Inside a block each lane moves 16-byte
 * vectors when source and destination are equally aligned modulo 16 (after a
 * short byte head that reaches that alignment), else 8- or 4-byte words, else
 * bytes; four vectors are loaded before any is stored, so that enough reads
 * are in flight to cover PCIe latency when the source is host memory.
 */

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct __attribute__((aligned(16))) v4 { u32 x, y, z, w; };

#define UNROLL 4

/* Bytes [from, to) of the block, one lane per byte. */
__device__ static void copy_bytes(u8 *d, const u8 *s, u64 from, u64 to, u32 lane, u32 lanes)
{
    for (u64 k = from + lane; k < to; k += lanes)
        d[k] = s[k];
}

/* Words of W bytes (W = 16, 8 or 4) over [0, n) of two W-aligned pointers. */
#define WORD_LOOP(T, d, s, n, lane, lanes)                                       \
    do {                                                                         \
        T *dw = (T *)(d);                                                        \
        const T *sw = (const T *)(s);                                            \
        u64 nw = (n) / sizeof(T);                                                \
        u64 step = (u64)(lanes) * UNROLL;                                        \
        u64 k = (lane);                                                          \
        for (; k + (u64)(lanes) * (UNROLL - 1) < nw; k += step) {                \
            T r[UNROLL];                                                         \
            _Pragma("unroll")                                                    \
            for (int u = 0; u < UNROLL; ++u) r[u] = sw[k + (u64)u * (lanes)];    \
            _Pragma("unroll")                                                    \
            for (int u = 0; u < UNROLL; ++u) dw[k + (u64)u * (lanes)] = r[u];    \
        }                                                                        \
        for (; k < nw; k += (lanes)) dw[k] = sw[k];                              \
    } while (0)

__device__ static void copy_block(u8 *d, const u8 *s, u64 n, u32 lane, u32 lanes)
{
    u64 da = (u64)d, sa = (u64)s;
    u32 width = ((da ^ sa) & 15) == 0 ? 16 : ((da ^ sa) & 7) == 0 ? 8 : ((da ^ sa) & 3) == 0 ? 4 : 1;
    if (width == 1 || n < 2 * (u64)width) {
        copy_bytes(d, s, 0, n, lane, lanes);
        return;
    }
    u64 head = (width - (da & (width - 1))) & (width - 1);  /* bytes up to the common alignment */
    u64 body = (n - head) & ~(u64)(width - 1);
    copy_bytes(d, s, 0, head, lane, lanes);
    u8 *db = d + head;
    const u8 *sb = s + head;
    if (width == 16)
        WORD_LOOP(struct v4, db, sb, body, lane, lanes);
    else if (width == 8)
        WORD_LOOP(u64, db, sb, body, lane, lanes);
    else
        WORD_LOOP(u32, db, sb, body, lane, lanes);
    copy_bytes(d, s, head + body, n, lane, lanes);
}

extern "C" __global__ void memkit_copy_blocks(u64 dst_base, u64 src_base,
                                              const u64 *__restrict__ dst_off,
                                              const u64 *__restrict__ src_off,
                                              const u64 *__restrict__ sizes,
                                              u64 size, u64 nblocks, u64 lanes)
{
    u32 lanes32 = (u32)lanes;
    u32 lane = threadIdx.x & (lanes32 - 1);
    u64 groups_per_cta = blockDim.x / lanes32;
    u64 group = (u64)blockIdx.x * groups_per_cta + threadIdx.x / lanes32;
    u64 ngroups = (u64)gridDim.x * groups_per_cta;
    for (u64 i = group; i < nblocks; i += ngroups) {
        u64 n = sizes ? sizes[i] : size;
        copy_block((u8 *)(dst_base + dst_off[i]), (const u8 *)(src_base + src_off[i]), n,
                   lane, lanes32);
    }
}
