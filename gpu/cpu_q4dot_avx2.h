/* AVX2/FMA/F16C bodies of gpu/cpu_q4dot.c, for CPUs without AVX-512 VNNI (included there; see
 * its header comment): the same layouts read as two halves of 8 rows, the same results. */

void q4_quantize(const float *x, int m, int k, int8_t *xq, float *dx, float *sx, int32_t *isx) {
    const int groups = k / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo the packs' lanes */
    for (int r = 0; r < m; r++) {
        for (int g = 0; g < groups; g++) {
            const float *p = x + (long)r * k + g * 32;
            __m256 a[4];
            for (int i = 0; i < 4; i++) a[i] = _mm256_loadu_ps(p + 8 * i);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a[0]), _mm256_andnot_ps(sign, a[1])),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, a[2]), _mm256_andnot_ps(sign, a[3])));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float d = _mm_cvtss_f32(m4) / 127.0f;
            float id = d > 0.0f ? 1.0f / d : 0.0f;
            __m256 vid = _mm256_set1_ps(id);
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(a[i], vid));
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            int s = _mm_cvtsi128_si32(s4);
            __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(xq + (long)r * k + g * 32), _mm256_permutevar8x32_epi32(b, order));
            dx[r * groups + g] = d;
            sx[r * groups + g] = d * (float)s;
            isx[r * groups + g] = s;
        }
    }
}

/* 8 rows' (one half of a tile) integer dot products with one group of 32 activations, from
 * u8 codes c[l] (8 rows x 4 consecutive k each) and s8 activations: u8 x s8 pairs summed in
 * int16 (maddubs), then pairs of those in int32 (madd). A 4-bit code's eight pair sums add up
 * within int16 (8 x 2 x 15 x 127 < 32,768): one madd a group. */
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) __m256i dot32_q4(const __m256i c[8], const int8_t *xr) {
    __m256i s0 = _mm256_maddubs_epi16(c[0], bcast4(xr)), s1 = _mm256_maddubs_epi16(c[1], bcast4(xr + 4));
    for (int l = 2; l < 8; l += 2) {
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(c[l], bcast4(xr + 4 * l)));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(c[l + 1], bcast4(xr + 4 * l + 4)));
    }
    return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), _mm256_set1_epi16(1));
}

/* The same for signed 8-bit codes q: |q| x (xq with q's sign) keeps a pair within int16
 * (2 x 128 x 127), so each product goes to int32 on its own. */
static inline __attribute__((always_inline)) __m256i dot32_q8(const __m256i q[8], const int8_t *xr) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int l = 0; l < 8; l += 2) {
        __m256i a = _mm256_maddubs_epi16(_mm256_sign_epi8(q[l], q[l]), _mm256_sign_epi8(bcast4(xr + 4 * l), q[l]));
        __m256i b = _mm256_maddubs_epi16(_mm256_sign_epi8(q[l + 1], q[l + 1]),
                                         _mm256_sign_epi8(bcast4(xr + 4 * l + 4), q[l + 1]));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(a, ones));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(b, ones));
    }
    return _mm256_add_epi32(s0, s1);
}

static inline void store_rows(float *out, __m256 v, int left) { /* the first `left` of 8 */
    if (left >= 8) {
        _mm256_storeu_ps(out, v);
    } else if (left > 0) {
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_maskstore_ps(out, _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane), v);
    }
}

/* Group g's 8-row half h of a 4-bit tile against mb activation rows: acc[r] += its scaled dot
 * products and bias terms. */
static inline __attribute__((always_inline)) void
half4(const job_t *j, const uint8_t *wc, const uint8_t *wf, int g, int h, int m0, const int mb,
      const int f32, __m256 *acc) {
    const int groups = j->k / 32;
    const __m256i low = _mm256_set1_epi8(15);
    __m256i c[8];
    for (int l = 0; l < 4; l++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(wc + g * 256 + l * 64 + h * 32));
        c[l] = _mm256_and_si256(v, low);
        c[l + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    __m256 scale, bias;
    if (f32) {
        scale = _mm256_loadu_ps((const float *)(wf + g * 128) + 8 * h);
        bias = _mm256_loadu_ps((const float *)(wf + g * 128 + 64) + 8 * h);
    } else {
        scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wf + g * 64 + 16 * h)));
        bias = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wf + g * 64 + 32 + 16 * h)));
    }
    for (int r = 0; r < mb; r++) {
        const int8_t *xr = j->xq + (size_t)(m0 + r) * j->k + g * 32;
        __m256 dot = _mm256_cvtepi32_ps(dot32_q4(c, xr));
        const float d = j->dx[(m0 + r) * groups + g], s = j->sx[(m0 + r) * groups + g];
        acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(d)), acc[r]);
        acc[r] = _mm256_fmadd_ps(bias, _mm256_set1_ps(s), acc[r]);
    }
}

static inline void prefetch4(const uint8_t *wc, const uint8_t *wf, int g, const int f32) {
    for (int l = 0; l < 4; l++) _mm_prefetch((const char *)wc + g * 256 + AHEAD + l * 64, _MM_HINT_T0);
    _mm_prefetch((const char *)wf + g * (f32 ? 128 : 64) + AHEAD / (f32 ? 2 : 4), _MM_HINT_T0);
    if (f32) _mm_prefetch((const char *)wf + g * 128 + AHEAD / 2 + 64, _MM_HINT_T0);
}

/* One activation row (a decode step's: memory-bound) takes both halves per group as the codes
 * stream in. More rows run the halves one after the other (the tile's codes stay in L1 between
 * the passes; prefetches in the first), so that one half's codes (8 registers), its mb
 * accumulators and the temporaries fit AVX2's 16: with both halves' 2 x mb accumulators live
 * they spilled (docs/benchmarks.md, session 18). Either order gives the same bits. */
static inline __attribute__((always_inline)) void
tile(const job_t *j, int t, int m0, const int mb, const int f32) {
    const int groups = j->k / 32;
    const uint8_t *wc = j->codes + (size_t)t * groups * 256;
    const uint8_t *wf = j->factors + (size_t)t * groups * (f32 ? 128 : 64);
    const int left = j->n - t * 16;
    float *out = j->out + (size_t)m0 * j->ldo + t * 16;
    if (mb == 1) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int g = 0; g < groups; g++) {
            prefetch4(wc, wf, g, f32);
            half4(j, wc, wf, g, 0, m0, 1, f32, &acc[0]);
            half4(j, wc, wf, g, 1, m0, 1, f32, &acc[1]);
        }
        for (int h = 0; h < 2; h++) store_rows(out + 8 * h, acc[h], left - 8 * h);
        return;
    }
    for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
        __m256 acc[4];
        for (int r = 0; r < mb; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            if (h == 0) prefetch4(wc, wf, g, f32);
            half4(j, wc, wf, g, h, m0, mb, f32, acc);
        }
        for (int r = 0; r < mb; r++) store_rows(out + (size_t)r * j->ldo + 8 * h, acc[r], left - 8 * h);
    }
}

/* Group g's half h of an 8-bit tile (form Q8_F16) against mb rows. */
static inline __attribute__((always_inline)) void
half8(const job_t *j, const uint8_t *wc, const uint8_t *wf, int g, int h, int m0, const int mb, __m256 *acc) {
    const int groups = j->k / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80); /* q + 128 -> q */
    __m256i q[8];
    for (int l = 0; l < 8; l++)
        q[l] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wc + g * 512 + l * 64 + h * 32)), flip);
    __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wf + g * 32 + 16 * h)));
    for (int r = 0; r < mb; r++) {
        const int8_t *xr = j->xq + (size_t)(m0 + r) * j->k + g * 32;
        const int row = (m0 + r) * groups + g;
        __m256 dot = _mm256_cvtepi32_ps(dot32_q8(q, xr));
        acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(j->dx[row])), acc[r]);
    }
}

static inline void prefetch8(const uint8_t *wc, const uint8_t *wf, int g) {
    for (int l = 0; l < 8; l++) _mm_prefetch((const char *)wc + g * 512 + AHEAD + l * 64, _MM_HINT_T0);
    _mm_prefetch((const char *)wf + g * 32 + AHEAD / 16, _MM_HINT_T0);
}

/* The same for an 8-bit weight, in the same two orders. */
static inline __attribute__((always_inline)) void tile8(const job_t *j, int t, int m0, const int mb) {
    const int groups = j->k / 32;
    const uint8_t *wc = j->codes + (size_t)t * groups * 512;
    const uint8_t *wf = j->factors + (size_t)t * groups * 32;
    const int left = j->n - t * 16;
    float *out = j->out + (size_t)m0 * j->ldo + t * 16;
    if (mb == 1) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int g = 0; g < groups; g++) {
            prefetch8(wc, wf, g);
            half8(j, wc, wf, g, 0, m0, 1, &acc[0]);
            half8(j, wc, wf, g, 1, m0, 1, &acc[1]);
        }
        for (int h = 0; h < 2; h++) store_rows(out + 8 * h, acc[h], left - 8 * h);
        return;
    }
    for (int h = 0; h < 2; h++) {
        __m256 acc[4];
        for (int r = 0; r < mb; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            if (h == 0) prefetch8(wc, wf, g);
            half8(j, wc, wf, g, h, m0, mb, acc);
        }
        for (int r = 0; r < mb; r++) store_rows(out + (size_t)r * j->ldo + 8 * h, acc[r], left - 8 * h);
    }
}
