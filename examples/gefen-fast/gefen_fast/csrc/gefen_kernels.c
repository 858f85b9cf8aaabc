/*
 * Fused CPU kernels for the Gefen block-vmean step (SPEC 1.8) and factored step (SPEC 1.9).
 *
 * One call updates one parameter, in place. Blocks are independent (every step of SPEC 1.8.8
 * is row-local), so they are spread over OpenMP threads; a block is read from memory once and
 * stays in cache for its passes:
 *   1-2. one read of the block: (block mode) the sum of squares -> vmean -> stepsize (SPEC 1.8.3,
 *      1.8.7), and decode old momentum, lerp, absolute maximum -> new magnitude (SPEC 1.8.8 1-3);
 *   3. decode and lerp again, normalise, nearest codeword by table, store the index, decode
 *      it, update the parameter (SPEC 1.8.8 steps 4-7).
 *
 * Arithmetic: fp32, one rounding per operation in the order the SPEC gives; the lerp is a true
 * fused multiply-add (fmaf). Built with -ffp-contract=off so that no other a*b+c is fused.
 * Differences from the reference (tolerance profile, SPEC 0.4.2): the association of the fp32
 * sums (block mean squares, factored row/column sums, mean of v_row) and sqrtf, which is the
 * correctly rounded IEEE square root. The momentum (indices, magnitudes) depends on neither
 * and equals the reference's bit for bit.
 *
 * Parameters and gradients are fp32 or bf16 (uint16 bit patterns); fp16 is widened by the
 * caller. All pointers passed to one call refer to distinct, non-overlapping buffers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CELLS 8192
#define CELL_SCALE 4096.0f

typedef struct {
    const float *decode;    /* fp32[256]: codewords rounded to the gradient dtype */
    const float *codebook;  /* fp32[256]: the search codebook */
    const uint16_t *first;  /* uint16[CELLS + 1]: change points below each cell */
    const float *points;    /* fp32: the change points, padded with two +inf */
    const int32_t *results; /* int32: the index between consecutive change points */
    int32_t exact;          /* 0: the table may not be used, search instead */
} Table;

typedef struct {
    float w;                /* r32(1 - beta1), the lerp weight */
    float beta2;            /* r32(beta2) */
    float one_minus_beta2;  /* r32(1 - beta2) */
    float bias2;            /* block: r32(sqrt(bc2)); factored: r32(bc2) */
    float eps;              /* r32(eps) */
    float inv_bias1;        /* r32(1 / bc1) */
    float lr;               /* r32(lr) */
    float decay;            /* r32(1 - lr * wd) */
    int32_t apply_decay;
    int32_t threads;
} Hyper;

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bf16_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }
static inline uint16_t f32_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)(f != f ? quiet : rounded);
}
static inline float round_bf16(float f) { return bf16_f32(f32_bf16(f)); }

/* torch lerp(cur, target, w) on CPU (SPEC 1.8.8 step 2, SPEC 1.13.3) */
static inline float lerp32(float cur, float target, float w, int small_weight) {
    float d = target - cur;
    float from_cur = fmaf(w, d, cur);
    float from_target = fmaf(-(1.0f - w), d, target);
    return small_weight ? from_cur : from_target;
}

/* The table's cell of a normalised value (see codeword_table.py); NaN goes to cell 0. */
static inline int32_t table_cell(float u) {
    float x = (u + 1.0f) * CELL_SCALE;
    x = x >= 0.0f ? x : 0.0f;
    x = x <= (float)CELLS ? x : (float)CELLS;
    return (int32_t)x;
}

static inline uint8_t table_lookup(float u, int32_t cell, const Table *t) {
    int j = t->first[cell];
    j += (u > t->points[j]) + (u > t->points[j + 1]);
    return (uint8_t)t->results[j];
}

/* SPEC 1.7.1 literally: lower bound, then one comparison; ties to the lower index */
static inline uint8_t nearest_by_search(float u, const float *cb) {
    if (u != u) return 255;
    int lo = 0, hi = 256;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (cb[mid] < u) lo = mid + 1; else hi = mid;
    }
    int left = lo - 1 < 0 ? 0 : lo - 1;
    int right = lo > 255 ? 255 : lo;
    return (uint8_t)(fabsf(u - cb[left]) <= fabsf(u - cb[right]) ? left : right);
}

#ifdef _OPENMP
#include <omp.h>
#define GEFEN_THREAD_IDS(t, nt) do { t = omp_get_thread_num(); nt = omp_get_num_threads(); } while (0)
#else
#define GEFEN_THREAD_IDS(t, nt) do { t = 0; nt = 1; } while (0)
#endif

#define STAGE 1024
/* Blocks up to this size keep their lerped momentum in the thread's scratch between passes 2 and 3. */
#define KEEP_MAX 65536

/*
 * DEFINE_KERNELS(SUFFIX, T, LOAD, STORE, ROUND_P, SQUARE, SQUARE_MEAN): the kernels for one
 * storage type. LOAD widens a stored value to fp32, STORE rounds fp32 to storage, ROUND_P
 * rounds to the parameter dtype keeping fp32, SQUARE and SQUARE_MEAN are the block-mode
 * square and mean (SPEC 1.8.3 table).
 */
#define DEFINE_KERNELS(SUFFIX, T, LOAD, STORE, ROUND_P, SQUARE, SQUARE_MEAN)                      \
                                                                                                 \
/* max_j |lerp(decoded old momentum, g)| (SPEC 1.8.8 step 3) as the max of the bit patterns:   \
   exact for non-negative floats, and a NaN (largest pattern) propagates. keep: the lerps. */  \
static float block_magnitude_##SUFFIX(const T *restrict g, const uint8_t *restrict idx,          \
                                      const float *restrict decode, int64_t n, float old,        \
                                      float w, int small, float *restrict keep) {                \
    uint32_t top = 0;                                                                            \
    if (keep) {                                                                                  \
        _Pragma("omp simd reduction(max:top)")                                                   \
        for (int64_t j = 0; j < n; j++) {                                                        \
            float upd = lerp32(decode[idx[j]] * old, LOAD(g[j]), w, small);                      \
            keep[j] = upd;                                                                       \
            uint32_t bits = f32_bits(upd) & 0x7FFFFFFFu;                                         \
            top = bits > top ? bits : top;                                                       \
        }                                                                                        \
    } else {                                                                                     \
        _Pragma("omp simd reduction(max:top)")                                                   \
        for (int64_t j = 0; j < n; j++) {                                                        \
            float upd = lerp32(decode[idx[j]] * old, LOAD(g[j]), w, small);                      \
            uint32_t bits = f32_bits(upd) & 0x7FFFFFFFu;                                         \
            top = bits > top ? bits : top;                                                       \
        }                                                                                        \
    }                                                                                            \
    return bits_f32(top);                                                                        \
}                                                                                                \
                                                                                                 \
/* Block mode: the block's fp32 sum of squares (SPEC 1.8.3) and its new magnitude in one read of g. */ \
static float block_sum_and_magnitude_##SUFFIX(const T *restrict g, const uint8_t *restrict idx,  \
                                              const float *restrict decode, int64_t n, float old, \
                                              float w, int small, float *restrict keep,          \
                                              float *restrict magnitude) {                       \
    uint32_t top = 0;                                                                            \
    float sum = 0.0f;                                                                            \
    if (keep) {                                                                                  \
        _Pragma("omp simd reduction(max:top) reduction(+:sum)")                                  \
        for (int64_t j = 0; j < n; j++) {                                                        \
            float x = LOAD(g[j]);                                                                \
            sum += SQUARE(x);                                                                    \
            float upd = lerp32(decode[idx[j]] * old, x, w, small);                               \
            keep[j] = upd;                                                                       \
            uint32_t bits = f32_bits(upd) & 0x7FFFFFFFu;                                         \
            top = bits > top ? bits : top;                                                       \
        }                                                                                        \
    } else {                                                                                     \
        _Pragma("omp simd reduction(max:top) reduction(+:sum)")                                  \
        for (int64_t j = 0; j < n; j++) {                                                        \
            float x = LOAD(g[j]);                                                                \
            sum += SQUARE(x);                                                                    \
            float upd = lerp32(decode[idx[j]] * old, x, w, small);                               \
            uint32_t bits = f32_bits(upd) & 0x7FFFFFFFu;                                         \
            top = bits > top ? bits : top;                                                       \
        }                                                                                        \
    }                                                                                            \
    *magnitude = bits_f32(top);                                                                  \
    return sum;                                                                                  \
}                                                                                                \
                                                                                                 \
/* SPEC 1.8.8 steps 4-7 for n elements. ss == NULL: one stepsize (block_ss), else one per     \
   element. kept == NULL: the lerps are recomputed from g and the old indices. */              \
static void requantize_##SUFFIX(T *restrict p, const T *restrict g, uint8_t *restrict idx,       \
                                const Table *tab, int64_t n, float old, float mag,               \
                                float block_ss, const float *restrict ss,                        \
                                const float *restrict kept, const Hyper *h,                      \
                                uint8_t *restrict codes, float *restrict normalised,             \
                                int32_t *restrict cells, float *restrict lerped) {               \
    const float *restrict decode = tab->decode;                                                  \
    const int positive = mag > 0.0f;                                                             \
    const int small = fabsf(h->w) < 0.5f;                                                        \
    for (int64_t s0 = 0; s0 < n; s0 += STAGE) {                                                  \
        int64_t m = n - s0 < STAGE ? n - s0 : STAGE;                                             \
        const float *restrict upd = kept ? kept + s0 : lerped;                                   \
        if (!kept) {                                                                             \
            const T *restrict gs = g + s0;                                                       \
            const uint8_t *restrict is = idx + s0;                                               \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) lerped[j] = lerp32(decode[is[j]] * old, LOAD(gs[j]), h->w, small); \
        }                                                                                        \
        if (tab->exact) {                                                                        \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) {                                                    \
                float ratio = upd[j] / mag;                                                      \
                float u = positive ? ratio : 0.0f;                                               \
                normalised[j] = u;                                                               \
                cells[j] = table_cell(u);                                                        \
            }                                                                                    \
            for (int64_t j = 0; j < m; j++) codes[j] = table_lookup(normalised[j], cells[j], tab); \
        } else {                                                                                 \
            for (int64_t j = 0; j < m; j++) {                                                    \
                float ratio = upd[j] / mag;                                                      \
                codes[j] = nearest_by_search(positive ? ratio : 0.0f, tab->codebook);            \
            }                                                                                    \
        }                                                                                        \
        T *restrict ps = p + s0;                                                                 \
        uint8_t *restrict iw = idx + s0;                                                         \
        const float scale = h->lr;                                                               \
        if (ss && h->apply_decay) {                                                              \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) {                                                    \
                uint8_t k = codes[j];                                                            \
                iw[j] = k;                                                                       \
                float delta = (decode[k] * mag * ss[j]) * scale;                                 \
                ps[j] = STORE(ROUND_P(LOAD(ps[j]) * h->decay) - delta);                          \
            }                                                                                    \
        } else if (ss) {                                                                         \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) {                                                    \
                uint8_t k = codes[j];                                                            \
                iw[j] = k;                                                                       \
                float delta = (decode[k] * mag * ss[j]) * scale;                                 \
                ps[j] = STORE(LOAD(ps[j]) - delta);                                              \
            }                                                                                    \
        } else if (h->apply_decay) {                                                             \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) {                                                    \
                uint8_t k = codes[j];                                                            \
                iw[j] = k;                                                                       \
                float delta = (decode[k] * mag * block_ss) * scale;                              \
                ps[j] = STORE(ROUND_P(LOAD(ps[j]) * h->decay) - delta);                          \
            }                                                                                    \
        } else {                                                                                 \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) {                                                    \
                uint8_t k = codes[j];                                                            \
                iw[j] = k;                                                                       \
                float delta = (decode[k] * mag * block_ss) * scale;                              \
                ps[j] = STORE(LOAD(ps[j]) - delta);                                              \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* SPEC 1.8: one block-vmean step of a flat parameter, in place. Returns 0, or -1 when the   \
   scratch could not be allocated (then nothing was changed). */                                \
int gefen_block_step_##SUFFIX(T *p, const T *g, uint8_t *idx, float *magnitude, float *vmean,   \
                              int64_t blocks, int64_t period, const Table *tab, const Hyper *h) { \
    const int small = fabsf(h->w) < 0.5f;                                                        \
    const int keep = period <= KEEP_MAX;                                                         \
    int threads = h->threads < 1 ? 1 : h->threads;                                               \
    float *scratch = keep ? (float *)malloc((size_t)threads * (size_t)period * sizeof(float)) : NULL; \
    if (keep && !scratch) return -1;                                                             \
    _Pragma("omp parallel num_threads(threads)")                                                 \
    {                                                                                            \
        uint8_t codes[STAGE];                                                                    \
        float normalised[STAGE];                                                                 \
        int32_t cells[STAGE];                                                                    \
        float lerped[STAGE];                                                                     \
        int t = 0, nt = 1;                                                                       \
        GEFEN_THREAD_IDS(t, nt);                                                                 \
        float *kept = keep ? scratch + (size_t)t * (size_t)period : NULL;                        \
        _Pragma("omp for schedule(static)")                                                      \
        for (int64_t b = 0; b < blocks; b++) {                                                   \
            const int64_t base = b * period;                                                     \
            const T *restrict gb = g + base;                                                     \
            float old = magnitude[b];                                                            \
            float mag;                                                                           \
            float sum = block_sum_and_magnitude_##SUFFIX(gb, idx + base, tab->decode, period, old, \
                                                         h->w, small, kept, &mag);               \
            magnitude[b] = mag;                                                                  \
            float mean_square = SQUARE_MEAN(sum / (float)period);                                \
            float v = fmaf(h->one_minus_beta2, mean_square, vmean[b] * h->beta2);                \
            vmean[b] = v;                                                                        \
            float stepsize = (1.0f / ((sqrtf(v) / h->bias2) + h->eps)) * h->inv_bias1;           \
            requantize_##SUFFIX(p + base, gb, idx + base, tab, period, old, mag, stepsize, NULL, \
                                kept, h, codes, normalised, cells, lerped);                                 \
        }                                                                                        \
    }                                                                                            \
    free(scratch);                                                                               \
    return 0;                                                                                    \
}                                                                                                \
                                                                                                 \
/* SPEC 1.9.3 steps 3-5; returns mu = max(mean(v_row), FLT_MIN), or -1 when out of memory    \
   (then nothing was changed). Column sums: one partial per thread, added in thread order. */  \
float gefen_factored_moments_##SUFFIX(const T *g, int64_t rows, int64_t cols, float *v_row,     \
                                      float *v_col, const Hyper *h) {                            \
    int threads = h->threads < 1 ? 1 : h->threads;                                               \
    float *parts = (float *)calloc((size_t)threads * (size_t)cols, sizeof(float));               \
    float *row_sums = (float *)malloc((size_t)rows * sizeof(float));                             \
    if (!parts || !row_sums) { free(parts); free(row_sums); return -1.0f; }                      \
    _Pragma("omp parallel num_threads(threads)")                                                 \
    {                                                                                            \
        int t = 0, nt = 1;                                                                       \
        GEFEN_THREAD_IDS(t, nt);                                                                 \
        float *restrict part = parts + (size_t)t * (size_t)cols;                                 \
        int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;                                    \
        for (int64_t r = r0; r < r1; r++) {                                                      \
            const T *restrict gr = g + r * cols;                                                 \
            float sum = 0.0f;                                                                    \
            _Pragma("omp simd reduction(+:sum)")                                                 \
            for (int64_t c = 0; c < cols; c++) {                                                 \
                float x = LOAD(gr[c]);                                                           \
                float s = x * x;                                                                 \
                part[c] += s;                                                                    \
                sum += s;                                                                        \
            }                                                                                    \
            row_sums[r] = sum;                                                                   \
        }                                                                                        \
    }                                                                                            \
    for (int64_t r = 0; r < rows; r++)                                                           \
        v_row[r] = fmaf(h->one_minus_beta2, row_sums[r] / (float)cols, v_row[r] * h->beta2);     \
    for (int t = 1; t < threads; t++) {                                                          \
        const float *restrict part = parts + (size_t)t * (size_t)cols;                           \
        _Pragma("omp simd")                                                                      \
        for (int64_t c = 0; c < cols; c++) parts[c] += part[c];                                  \
    }                                                                                            \
    for (int64_t c = 0; c < cols; c++)                                                           \
        v_col[c] = fmaf(h->one_minus_beta2, parts[c] / (float)rows, v_col[c] * h->beta2);        \
    float total = 0.0f;                                                                          \
    _Pragma("omp simd reduction(+:total)")                                                       \
    for (int64_t r = 0; r < rows; r++) total += v_row[r];                                        \
    float mu = total / (float)rows;                                                              \
    free(parts);                                                                                 \
    free(row_sums);                                                                              \
    return mu > 1.17549435e-38f ? mu : 1.17549435e-38f;                                          \
}                                                                                                \
                                                                                                 \
/* SPEC 1.9.3 steps 6-10: the block momentum with a stepsize per element,                      \
   inv_bias1 / (sqrt(v_row[r] / mu / bc2) * sqrt(v_col[c]) + eps): the reference's           \
   sqrt(v_row[r] * v_col[c] / mu / bc2) with the square root split into a row and a column    \
   factor computed once each (a few ulp from the reference, tolerance profile). */             \
int gefen_factored_step_##SUFFIX(T *p, const T *g, uint8_t *idx, float *magnitude,              \
                                 int64_t blocks, int64_t period, int64_t cols,                   \
                                 const float *v_row, const float *v_col, float mu,               \
                                 const Table *tab, const Hyper *h) {                             \
    const int small = fabsf(h->w) < 0.5f;                                                        \
    const int keep = period <= KEEP_MAX;                                                         \
    int threads = h->threads < 1 ? 1 : h->threads;                                               \
    float *scratch = keep ? (float *)malloc((size_t)threads * (size_t)period * sizeof(float)) : NULL; \
    float *col_roots = (float *)malloc((size_t)cols * sizeof(float));                            \
    if ((keep && !scratch) || !col_roots) { free(scratch); free(col_roots); return -1; }         \
    _Pragma("omp simd")                                                                          \
    for (int64_t c = 0; c < cols; c++) col_roots[c] = sqrtf(v_col[c]);                           \
    _Pragma("omp parallel num_threads(threads)")                                                 \
    {                                                                                            \
        uint8_t codes[STAGE];                                                                    \
        float normalised[STAGE];                                                                 \
        int32_t cells[STAGE];                                                                    \
        float lerped[STAGE];                                                                     \
        float ss[STAGE];                                                                         \
        int t = 0, nt = 1;                                                                       \
        GEFEN_THREAD_IDS(t, nt);                                                                 \
        float *kept = keep ? scratch + (size_t)t * (size_t)period : NULL;                        \
        _Pragma("omp for schedule(static)")                                                      \
        for (int64_t b = 0; b < blocks; b++) {                                                   \
            const int64_t base = b * period;                                                     \
            float old = magnitude[b];                                                            \
            float mag = block_magnitude_##SUFFIX(g + base, idx + base, tab->decode, period, old, h->w, small, kept); \
            magnitude[b] = mag;                                                                  \
            for (int64_t s0 = 0; s0 < period; s0 += STAGE) {                                     \
                int64_t m = period - s0 < STAGE ? period - s0 : STAGE;                           \
                int64_t first = base + s0;                                                       \
                int64_t r = first / cols, c = first - r * cols;                                  \
                for (int64_t done = 0; done < m;) {                                              \
                    int64_t count = cols - c < m - done ? cols - c : m - done;                   \
                    const float row_root = sqrtf((v_row[r] / mu) / h->bias2);                    \
                    const float *restrict vc = col_roots + c;                                    \
                    float *restrict out = ss + done;                                             \
                    _Pragma("omp simd")                                                          \
                    for (int64_t j = 0; j < count; j++)                                          \
                        out[j] = h->inv_bias1 / (row_root * vc[j] + h->eps);                     \
                    done += count;                                                               \
                    r += 1;                                                                      \
                    c = 0;                                                                       \
                }                                                                                \
                requantize_##SUFFIX(p + first, g + first, idx + first, tab, m, old, mag, 0.0f,   \
                                    ss, kept ? kept + s0 : NULL, h, codes, normalised, cells, lerped);\
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    free(scratch);                                                                               \
    free(col_roots);                                                                             \
    return 0;                                                                                    \
}


#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
#define ROUND_F32(x) (x)
#define SQUARE_F32(x) ((x) * (x))
#define SQUARE_MEAN_F32(x) (x)
DEFINE_KERNELS(f32, float, LOAD_F32, STORE_F32, ROUND_F32, SQUARE_F32, SQUARE_MEAN_F32)

#define LOAD_BF16(x) bf16_f32(x)
#define STORE_BF16(x) f32_bf16(x)
#define ROUND_BF16(x) round_bf16(x)
#define SQUARE_BF16(x) round_bf16((x) * (x))
#define SQUARE_MEAN_BF16(x) round_bf16(x)
DEFINE_KERNELS(bf16, uint16_t, LOAD_BF16, STORE_BF16, ROUND_BF16, SQUARE_BF16, SQUARE_MEAN_BF16)
