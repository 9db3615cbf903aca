/* AVX-512 F/BW/VNNI bodies of gpu/cpu_q4dot.c (included there; see its header comment). */

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
