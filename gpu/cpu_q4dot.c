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
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "needs AVX-512 F, BW and VNNI"
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

int q4_abi_version(void) { return 2; }

/* ---- activations: int8 per group of 32 ---------------------------------------------------- */

void q4_quantize(const float *x, int m, int k, int8_t *xq, float *dx, float *sx, int32_t *isx) {
    int groups = k / 32;
    for (int r = 0; r < m; r++) {
        for (int g = 0; g < groups; g++) {
            const float *p = x + (long)r * k + g * 32;
            __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            float d = amax / 127.0f;
            float id = d > 0.0f ? 1.0f / d : 0.0f;
            __m512 vid = _mm512_set1_ps(id);
            __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid));
            __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
            int8_t *o = xq + (long)r * k + g * 32;
            _mm_storeu_si128((__m128i *)o, _mm512_cvtsepi32_epi8(qa));
            _mm_storeu_si128((__m128i *)(o + 16), _mm512_cvtsepi32_epi8(qb));
            int s = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
            dx[r * groups + g] = d;
            sx[r * groups + g] = d * (float)s;
            isx[r * groups + g] = s;
        }
    }
}

/* ---- one tile of 16 weight rows against MB activation rows -------------------------------- */

/* Bytes of codes fetched ahead of use (the factors' stream the same number of groups ahead): the
 * hardware prefetcher alone left the 120 matmuls of a decode step at ~7 GB/s a core here; a few
 * KiB ahead was 1.5-2x faster (docs/benchmarks.md). Prefetches never fault past the end. */
#define AHEAD 4096

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* 16 rows' integer dot products with one group of 32 activations: c[l] holds the rows' 4 codes
 * at k = 4l..4l+3 (unsigned), `init` the starting sums; two chains for the latency. */
static inline __attribute__((always_inline)) __m512i dot32(const __m512i c[8], const int8_t *xr,
                                                           __m512i init) {
    __m512i s0 = init, s1 = _mm512_setzero_si512();
    s0 = _mm512_dpbusd_epi32(s0, c[0], bcast4(xr));
    s1 = _mm512_dpbusd_epi32(s1, c[1], bcast4(xr + 4));
    s0 = _mm512_dpbusd_epi32(s0, c[2], bcast4(xr + 8));
    s1 = _mm512_dpbusd_epi32(s1, c[3], bcast4(xr + 12));
    s0 = _mm512_dpbusd_epi32(s0, c[4], bcast4(xr + 16));
    s1 = _mm512_dpbusd_epi32(s1, c[5], bcast4(xr + 20));
    s0 = _mm512_dpbusd_epi32(s0, c[6], bcast4(xr + 24));
    s1 = _mm512_dpbusd_epi32(s1, c[7], bcast4(xr + 28));
    return _mm512_add_epi32(s0, s1);
}

static inline __attribute__((always_inline)) void
tile(const job_t *j, int t, int m0, const int mb, const int f32) {
    const int k = j->k, groups = k / 32;
    const uint8_t *wc = j->codes + (size_t)t * groups * 256;
    const uint8_t *wf = j->factors + (size_t)t * groups * (f32 ? 128 : 64);
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[4];
    for (int r = 0; r < mb; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i c[8];
        for (int l = 0; l < 4; l++) _mm_prefetch((const char *)wc + g * 256 + AHEAD + l * 64, _MM_HINT_T0);
        _mm_prefetch((const char *)wf + g * (f32 ? 128 : 64) + AHEAD / (f32 ? 2 : 4), _MM_HINT_T0);
        if (f32) _mm_prefetch((const char *)wf + g * 128 + AHEAD / 2 + 64, _MM_HINT_T0);
        for (int l = 0; l < 4; l++) {
            __m512i v = _mm512_loadu_si512(wc + g * 256 + l * 64);
            c[l] = _mm512_and_si512(v, low);
            c[l + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        __m512 scale, bias;
        if (f32) {
            scale = _mm512_loadu_ps((const float *)(wf + g * 128));
            bias = _mm512_loadu_ps((const float *)(wf + g * 128 + 64));
        } else {
            scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wf + g * 64)));
            bias = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wf + g * 64 + 32)));
        }
        for (int r = 0; r < mb; r++) {
            const int8_t *xr = j->xq + (size_t)(m0 + r) * k + g * 32;
            __m512 dot = _mm512_cvtepi32_ps(dot32(c, xr, _mm512_setzero_si512()));
            const float d = j->dx[(m0 + r) * groups + g], s = j->sx[(m0 + r) * groups + g];
            acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(d)), acc[r]);
            acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(s), acc[r]);
        }
    }
    int left = j->n - t * 16;
    __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    for (int r = 0; r < mb; r++)
        _mm512_mask_storeu_ps(j->out + (size_t)(m0 + r) * j->ldo + t * 16, mask, acc[r]);
}

/* The same for an 8-bit weight (form Q8_F16). */
static inline __attribute__((always_inline)) void tile8(const job_t *j, int t, int m0, const int mb) {
    const int k = j->k, groups = k / 32;
    const uint8_t *wc = j->codes + (size_t)t * groups * 512;
    const uint8_t *wf = j->factors + (size_t)t * groups * 32;
    __m512 acc[4];
    for (int r = 0; r < mb; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i c[8];
        for (int l = 0; l < 8; l++) _mm_prefetch((const char *)wc + g * 512 + AHEAD + l * 64, _MM_HINT_T0);
        _mm_prefetch((const char *)wf + g * 32 + AHEAD / 16, _MM_HINT_T0);
        for (int l = 0; l < 8; l++) c[l] = _mm512_loadu_si512(wc + g * 512 + l * 64);
        __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wf + g * 32)));
        for (int r = 0; r < mb; r++) {
            const int8_t *xr = j->xq + (size_t)(m0 + r) * k + g * 32;
            const int row = (m0 + r) * groups + g;
            __m512 dot = _mm512_cvtepi32_ps(dot32(c, xr, _mm512_set1_epi32(-128 * j->isx[row])));
            acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(j->dx[row])), acc[r]);
        }
    }
    int left = j->n - t * 16;
    __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    for (int r = 0; r < mb; r++)
        _mm512_mask_storeu_ps(j->out + (size_t)(m0 + r) * j->ldo + t * 16, mask, acc[r]);
}

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

static int threads_per_call = 1;

/* Use `threads` threads (the caller included) per call from now on; returns the number set. */
int q4_set_threads(int threads) {
    threads_per_call = threads < 1 ? 1 : threads;
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
    int parts = (long)m * n * k >= min_split ? threads_per_call : 1;
    if (parts > j.tiles) parts = j.tiles;
    run_job(&j, parts);
    free(buf);
    return 0;
}
