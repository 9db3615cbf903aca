/* 4-bit and 8-bit weight x fp32 activation matmuls on the CPU with 8-bit activations and VNNI
 * integer dot products (AVX-512 VNNI), as llama.cpp runs Q4_1 x Q8_1 and Q8_0 x Q8_0. Built and
 * loaded by gpu/cpu_q4lib.py (gcc -O3 -march=native -fopenmp, ctypes); no Python or torch
 * headers.
 *
 * Weight layout (gpu/cpu_q4.py builds it): rows in tiles of 16, K in groups of 32.
 *   codes   uint8 [T][G][4][16][4]: byte (l, i, c) of tile t, group g holds row 16t + i's code
 *           at k = 32g + 4l + c in its low nibble and at k = 32g + 16 + 4l + c in its high one
 *           (a permutation of GGUF's Q4_0/Q4_1 bytes), so one 64-byte load unpacks into two
 *           vpdpbusd operands: 16 rows x 4 consecutive k each.
 *   factors [T][G][2][16] fp16 (or fp32): the 16 rows' scale, then their bias; w = q s + b.
 * Activations: each row of x is rounded per group of 32 to int8, xq = round(x / d),
 * d = max|x| / 127 (round half to even); then
 *   out[m, n] = sum_g  s[n,g] d[m,g] sum_k q xq  +  b[n,g] (d[m,g] sum_k xq)
 * accumulated in fp32 in group order. Every output row n is computed by one thread, in the same
 * order whatever the thread count, so the result does not depend on it.
 *
 * 8-bit weights (GGUF Q8_0, w = s q, q in -128..127; gpu/cpu_q8.py builds the layout):
 *   codes   uint8 [T][G][8][16][4] = q + 128: byte (j, i, c) is row 16t + i at k = 32g + 4j + c
 *   factors [T][G][16] fp16: the rows' scales (the file's own fp16)
 * vpdpbusd multiplies unsigned by signed bytes, so sum_k (q + 128) xq - 128 sum_k xq is the
 * exact integer sum_k q xq; out[m, n] = sum_g s[n,g] d[m,g] sum_k q xq, in fp32, group order.
 *
 * Without AVX-512 VNNI (AVX2, FMA and F16C: most x86 CPUs) the same layouts are read as two
 * halves of 8 rows (a 64-byte load's two 32-byte lanes) and the integer sums come from
 * vpmaddubsw (u8 x s8 pairs into int16) and vpmaddwd (int16 pairs into int32), as llama.cpp's
 * AVX2 path: a 4-bit code times |xq| <= 127 leaves 8 pair sums of a group within int16; an 8-bit
 * code is made signed (q), and |q| x sign(q) xq keeps each pair sum within int16. The integer
 * sums are exact either way and the fp32 steps are the same operations in the same order, so
 * both builds give the same bits.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define Q4_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q4_AVX512 0
#else
#error "needs AVX-512 F, BW and VNNI, or AVX2, FMA and F16C"
#endif

enum { Q4_F16 = 0, Q4_F32 = 1, Q8_F16 = 2 }; /* weight forms */

typedef struct {
    const uint8_t *codes;
    const uint8_t *factors;
    int form, n, k, m, tiles;
    const int8_t *xq;
    const float *dx, *sx;
    const int32_t *isx;
    float *out;
    long ldo;
} job_t;

int q4_abi_version(void) { return 3; }

/* ---- activations: int8 per group of 32; one tile of 16 weight rows against MB activation
 * rows (q4_quantize, tile, tile8: one file per instruction set) ---------------------------- */

/* Bytes of codes fetched ahead of use (the factors' stream the same number of groups ahead): the
 * hardware prefetcher alone left the 120 matmuls of a decode step at ~7 GB/s a core here; a few
 * KiB ahead was 1.5-2x faster (docs/benchmarks.md). Prefetches never fault past the end. */
#define AHEAD 4096

#if Q4_AVX512
#include "cpu_q4dot_avx512.h"
#else
#include "cpu_q4dot_avx2.h"
#endif

static void tiles8(const job_t *j, int t0, int t1) {
    for (int t = t0; t < t1; t++) {
        int m0 = 0;
        for (; m0 + 4 <= j->m; m0 += 4) tile8(j, t, m0, 4);
        switch (j->m - m0) {
        case 3: tile8(j, t, m0, 3); break;
        case 2: tile8(j, t, m0, 2); break;
        case 1: tile8(j, t, m0, 1); break;
        default: break;
        }
    }
}

static void tiles_f(const job_t *j, int t0, int t1, const int f32) {
    for (int t = t0; t < t1; t++) {
        int m0 = 0;
        for (; m0 + 4 <= j->m; m0 += 4) tile(j, t, m0, 4, f32);
        switch (j->m - m0) {
        case 3: tile(j, t, m0, 3, f32); break;
        case 2: tile(j, t, m0, 2, f32); break;
        case 1: tile(j, t, m0, 1, f32); break;
        default: break;
        }
    }
}

static void run_part(const job_t *j, int part, int parts) {
    int t0 = (int)((long)j->tiles * part / parts), t1 = (int)((long)j->tiles * (part + 1) / parts);
    if (j->form == Q8_F16)
        tiles8(j, t0, t1);
    else if (j->form == Q4_F32)
        tiles_f(j, t0, t1, 1);
    else
        tiles_f(j, t0, t1, 0);
}

/* ---- threads: torch's own OpenMP pool ---------------------------------------------------- */
/* The library links libgomp.so.1, which in a process that imported torch is torch's own copy
 * (the loader matches the soname), so a call's parallel region runs on the threads that run
 * torch's ops: no second pool competing with torch's spinning workers for the cores. */

static int threads_per_call = 1, threads_one_row = 1;

/* Use `threads` threads (the caller included) per call from now on, `one_row` for a call of one
 * activation row (a decode step's); returns the number set. */
int q4_set_threads(int threads, int one_row) {
    threads_per_call = threads < 1 ? 1 : threads;
    threads_one_row = one_row < 1 ? 1 : one_row;
    return threads_per_call;
}

static void run_job(const job_t *j, int parts) {
    if (parts <= 1) {
        run_part(j, 0, 1);
        return;
    }
#pragma omp parallel num_threads(parts)
    run_part(j, omp_get_thread_num(), omp_get_num_threads());
}

/* ---- entry point -------------------------------------------------------------------------- */

/* out[m, :n] (row stride ldo) = x [m, k] (fp32, contiguous) times the packed weight [n, k] of
 * `form` (Q4_F16, Q4_F32, Q8_F16) transposed; k a multiple of 32. `min_split` is the least
 * m * n * k worth splitting over threads. Returns 0, or -1 when out of memory. */
int q4_matmul(const float *x, int m, int k, const uint8_t *codes, const uint8_t *factors, int form,
              int n, float *out, long ldo, long min_split) {
    int groups = k / 32;
    size_t xq_bytes = ((size_t)m * k + 63) & ~(size_t)63;
    uint8_t *buf = malloc(xq_bytes + 3 * sizeof(float) * (size_t)m * groups + 64);
    if (!buf) return -1;
    int8_t *xq = (int8_t *)buf;
    float *dx = (float *)(buf + xq_bytes), *sx = dx + (size_t)m * groups;
    int32_t *isx = (int32_t *)(sx + (size_t)m * groups);
    q4_quantize(x, m, k, xq, dx, sx, isx);
    job_t j = {codes, factors, form, n, k, m, (n + 15) / 16, xq, dx, sx, isx, out, ldo};
    int parts = (long)m * n * k < min_split ? 1 : m == 1 ? threads_one_row : threads_per_call;
    if (parts > j.tiles) parts = j.tiles;
    run_job(&j, parts);
    free(buf);
    return 0;
}
