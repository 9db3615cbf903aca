/* All decoder layers of one decoding sequence in one call: the CPU fast path's native form
 * (gpu/cpu_layers.py drives it; gpu/cpu_decode.py the torch form it replaces). Built into the
 * same library as gpu/cpu_q4dot.c, whose q4_matmul runs the four projections of each layer.
 *
 * Per layer, for the one row x (the residual stream, fp32 [hidden]):
 *   x += h (the last layer's down projection; not before the first layer)
 *   a = rms_norm(x) * input_norm            qkv = a @ Wqkv (+ bias)
 *   rotary on the q and k heads (rotate-half: [x1 c - x2 s | x2 c + x1 s])
 *   k, v -> the KV pool at the token's row   o = softmax(q k^T * scale) v over the sequence
 *   h = o @ Wo, x += h, a = rms_norm(x) * post_norm
 *   gu = a @ Wgate_up, m = silu(gate) * up, h = m @ Wdown
 * and at the end x += h, out = rms_norm(x) * final_norm (the logits' input).
 *
 * Same arithmetic as the torch form up to fp32 summation order (sums of squares, dot products,
 * the softmax): the logits agree to ~1e-5 relative (tests/gpu/test_cpu_decode.py). Attention
 * splits the query heads over `threads` OpenMP threads (torch's pool, as q4_matmul's split) once
 * a sequence is long enough to pay for the wake-up.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

int q4_matmul(const float *x, int m, int k, const uint8_t *codes, const uint8_t *factors, int form,
              int n, float *out, long ldo, long min_split);

typedef struct {
    const uint8_t *codes, *factors;
    int form, n, k;
} q4w_t;

typedef struct {
    const float *input_norm, *post_norm, *qkv_bias; /* qkv_bias may be NULL */
    q4w_t qkv, o, gate_up, down;
    float *k_pool, *v_pool; /* [rows, hkv, d] fp32 */
    float scale;
} layer_t;

typedef struct {
    int hidden, inter, hq, hkv, d, block_size, seq_len, threads;
    float eps;
    long slot;                 /* the token's row in the pools */
    const int64_t *table;      /* the sequence's block ids */
    const float *cos, *sin;    /* d / 2 each: the token's rotary row */
    const float *final_norm;
    long min_split;            /* q4_matmul's: least m n k worth splitting */
    /* buffers: x [hidden] (holds the embedding on entry), out [hidden], a [max(hidden, inter)],
     * qkv [(hq + 2 hkv) d], scores [hq * seq_len], attn [hq d], gu [2 inter], h [hidden] */
    float *x, *out, *a, *qkv, *scores, *attn, *gu, *h;
} step_t;

int cl_abi_version(void) { return 1; }

static void rms_norm(const float *x, const float *w, float *out, int n, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) sum += x[i] * x[i];
    float r = 1.0f / sqrtf(sum / (float)n + eps);
#pragma omp simd
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

static void add(float *x, const float *h, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) x[i] += h[i];
}

static void rotate(float *heads, int num_heads, int d, const float *c, const float *s) {
    int half = d / 2;
    for (int h = 0; h < num_heads; h++) {
        float *p = heads + (long)h * d;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float x1 = p[i], x2 = p[i + half];
            p[i] = x1 * c[i] - x2 * s[i];
            p[i + half] = x2 * c[i] + x1 * s[i];
        }
    }
}

static void attend_head(const layer_t *L, const step_t *s, int head) {
    int d = s->d, hkv = s->hkv, bs = s->block_size, n = s->seq_len;
    int g = head / (s->hq / hkv);
    const float *q = s->qkv + (long)head * d;
    float *sc = s->scores + (long)head * n, *o = s->attn + (long)head * d;
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) {
        long row = s->table[t / bs] * bs + t % bs;
        const float *k = L->k_pool + (row * hkv + g) * d;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < d; i++) dot += q[i] * k[i];
        sc[t] = dot * L->scale;
        mx = sc[t] > mx ? sc[t] : mx;
    }
    float sum = 0.0f;
    for (int t = 0; t < n; t++) {
        sc[t] = expf(sc[t] - mx);
        sum += sc[t];
    }
    memset(o, 0, sizeof(float) * d);
    for (int t = 0; t < n; t++) {
        long row = s->table[t / bs] * bs + t % bs;
        const float *v = L->v_pool + (row * hkv + g) * d;
        float p = sc[t];
#pragma omp simd
        for (int i = 0; i < d; i++) o[i] += p * v[i];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < d; i++) o[i] *= inv;
}

static int matmul(const q4w_t *w, const float *x, float *out, long min_split) {
    return q4_matmul(x, 1, w->k, w->codes, w->factors, w->form, w->n, out, w->n, min_split);
}

static int layer(const layer_t *L, const step_t *s, int first) {
    int H = s->hidden, I = s->inter, hq = s->hq, hkv = s->hkv, d = s->d;
    if (!first) add(s->x, s->h, H);
    rms_norm(s->x, L->input_norm, s->a, H, s->eps);
    if (matmul(&L->qkv, s->a, s->qkv, s->min_split)) return -1;
    if (L->qkv_bias) add(s->qkv, L->qkv_bias, (hq + 2 * hkv) * d);
    rotate(s->qkv, hq + hkv, d, s->cos, s->sin);
    memcpy(L->k_pool + s->slot * hkv * d, s->qkv + (long)hq * d, sizeof(float) * hkv * d);
    memcpy(L->v_pool + s->slot * hkv * d, s->qkv + (long)(hq + hkv) * d, sizeof(float) * hkv * d);
    int split = s->threads > 1 && (long)s->seq_len * hq >= 4096;
#pragma omp parallel for num_threads(s->threads) if (split) schedule(static)
    for (int head = 0; head < hq; head++) attend_head(L, s, head);
    if (matmul(&L->o, s->attn, s->h, s->min_split)) return -1;
    add(s->x, s->h, H);
    rms_norm(s->x, L->post_norm, s->a, H, s->eps);
    if (matmul(&L->gate_up, s->a, s->gu, s->min_split)) return -1;
#pragma omp simd
    for (int i = 0; i < I; i++) {
        float gate = s->gu[i];
        s->a[i] = gate / (1.0f + expf(-gate)) * s->gu[I + i];
    }
    return matmul(&L->down, s->a, s->h, s->min_split);
}

/* The layers, then the final norm into s->out; 0, or -1 when a matmul ran out of memory. */
int cl_layers(const layer_t *layers, int num_layers, const step_t *s) {
    for (int l = 0; l < num_layers; l++)
        if (layer(&layers[l], s, l == 0)) return -1;
    add(s->x, s->h, s->hidden);
    rms_norm(s->x, s->final_norm, s->out, s->hidden, s->eps);
    return 0;
}
