/*
 * The steady step: the block-vmean step (SPEC 1.8) and the factored step (SPEC 1.9) of one
 * parameter, in place, one pass over memory.
 *
 * A block (period P consecutive elements) needs its new magnitude (a maximum over the whole
 * block) before any element can be requantised, so each block is visited twice:
 *   pass A: read g and the old indices; decode, lerp (SPEC 1.8.8 steps 1-2), keep the lerped
 *           momentum in a per-thread scratch, the absolute maximum (step 3) and, in block mode,
 *           the sum of squares (SPEC 1.8.3);
 *   pass B: normalise, nearest codeword by the cell table (steps 4-5), store the index, decode,
 *           update the parameter (steps 6-7, SPEC 1.8.6 weight decay first).
 * Blocks up to KEEP_MAX elements are spread over threads whole, and the second visit reads the
 * kept momentum from the cache: memory is read once (p, g, indices) and written once (p, indices).
 * Larger blocks are split over the threads instead (a reduction of maximum and sum between the
 * passes) and pass B recomputes the lerp from g and the old index.
 *
 * Arithmetic is fp32, one rounding per operation; the lerp is a true fused multiply-add (fmaf /
 * vfmadd). Differences from the reference, all inside the tolerance profile (SPEC 5.6.1): the
 * association of fp32 sums (block sums, row and column sums), the IEEE square root (SPEC 1.13.1),
 * the stepsize as inv_bias1 / den (factored) and the update as q * r32(r32(mag * ss) * lr) (block)
 * or r32(q * ss) * r32(mag * lr) (factored). The momentum (indices, magnitudes) depends on none of
 * them and equals the reference's bit for bit.
 *
 * Storage types: fp32, bf16 and fp16 (uint16 bit patterns); the parameter and gradient share it.
 * All pointers of one call refer to distinct, non-overlapping buffers (Python checks).
 */
#include "gefen_common.h"

/* Blocks up to this size keep their lerped momentum in a per-thread scratch between the passes. */
#define KEEP_MAX 65536

/* ---------------------------------------------------------------- scalar element operations */

#define LOAD_f32(x) (x)
#define STORE_f32(x) (x)
#define ROUND_f32(x) (x)
#define SQUARE_f32(x) ((x) * (x))
#define SQUARE_MEAN_f32(x) (x)

#define LOAD_bf16(x) bf16_f32(x)
#define STORE_bf16(x) f32_bf16(x)
#define ROUND_bf16(x) round_bf16(x)
#define SQUARE_bf16(x) round_bf16((x) * (x))
#define SQUARE_MEAN_bf16(x) round_bf16(x)

#if GEFEN_HALF
#define LOAD_f16(x) f16_f32(x)
#define STORE_f16(x) f32_f16(x)
#define ROUND_f16(x) round_f16(x)
#define SQUARE_f16(x) ((x) * (x))
#define SQUARE_MEAN_f16(x) (x)
#endif

/* ------------------------------------------------------------- vector element operations */
#if GEFEN_AVX2

static inline __m256 vload_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore_f32(float *p, __m256 x) { _mm256_storeu_ps(p, x); }
static inline __m256 vround_f32(__m256 x) { return x; }
static inline __m256 vsquare_f32(__m256 x) { return _mm256_mul_ps(x, x); }

static inline __m256 vload_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
/* the rounded bf16 bit pattern in the low half of each lane (f32_bf16, lane-wise) */
static inline __m256i vbf16_bits(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(nan));
}
static inline void vstore_bf16(uint16_t *p, __m256 x) {
    __m256i b = vbf16_bits(x);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
static inline __m256 vround_bf16(__m256 x) { return _mm256_castsi256_ps(_mm256_slli_epi32(vbf16_bits(x), 16)); }
static inline __m256 vsquare_bf16(__m256 x) { return vround_bf16(_mm256_mul_ps(x, x)); }

#if GEFEN_HALF == 1
static inline __m256 vload_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void vstore_f16(uint16_t *p, __m256 x) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
static inline __m256 vround_f16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }
static inline __m256 vsquare_f16(__m256 x) { return _mm256_mul_ps(x, x); }
#define GEFEN_VECTOR_F16 1
#else
#define GEFEN_VECTOR_F16 0
#endif

/* decode[k[0..7]]: eight scalar loads (faster than a hardware gather on the CPUs measured) */
static inline __m256 vdecode(const float *decode, const uint8_t *k) {
    __m128 a = _mm_load_ss(decode + k[0]);
    a = _mm_insert_ps(a, _mm_load_ss(decode + k[1]), 0x10);
    a = _mm_insert_ps(a, _mm_load_ss(decode + k[2]), 0x20);
    a = _mm_insert_ps(a, _mm_load_ss(decode + k[3]), 0x30);
    __m128 b = _mm_load_ss(decode + k[4]);
    b = _mm_insert_ps(b, _mm_load_ss(decode + k[5]), 0x10);
    b = _mm_insert_ps(b, _mm_load_ss(decode + k[6]), 0x20);
    b = _mm_insert_ps(b, _mm_load_ss(decode + k[7]), 0x30);
    return _mm256_set_m128(b, a);
}

static inline __m256 vload_cell_pair(const char *first, const char *second) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)first)),
                                _mm_loadu_ps((const float *)second), 1);
}

/* The nearest codeword of eight normalised values by the cell table (SPEC 1.7, see
 * codeword_table.py): returns the decoded codewords; *codes gets each code in its lane's low byte.
 * The eight 16-byte cells are loaded whole and transposed into t, lo_val, hi_val, codes. */
static inline __m256 vnearest(__m256 u, const Cell *cells, __m256i *codes) {
    __m256 x = _mm256_mul_ps(_mm256_add_ps(u, _mm256_set1_ps(1.0f)), _mm256_set1_ps(GEFEN_CELL_SCALE));
    /* u in [-1, 1] gives 0..8192; NaN converts to 0x80000000, which the unsigned minimum sends to the NaN cell */
    __m256i cell = _mm256_min_epu32(_mm256_cvttps_epi32(x), _mm256_set1_epi32(GEFEN_NAN_CELL));
    cell = _mm256_slli_epi32(cell, 4);
    __m128i low = _mm256_castsi256_si128(cell), high = _mm256_extracti128_si256(cell, 1);
    uint64_t a = (uint64_t)_mm_cvtsi128_si64(low), b = (uint64_t)_mm_extract_epi64(low, 1);
    uint64_t c = (uint64_t)_mm_cvtsi128_si64(high), d = (uint64_t)_mm_extract_epi64(high, 1);
    const char *base = (const char *)cells;
    __m256 r0 = vload_cell_pair(base + (uint32_t)a, base + (uint32_t)c);  /* elements 0, 4 */
    __m256 r1 = vload_cell_pair(base + (a >> 32), base + (c >> 32));      /* 1, 5 */
    __m256 r2 = vload_cell_pair(base + (uint32_t)b, base + (uint32_t)d);  /* 2, 6 */
    __m256 r3 = vload_cell_pair(base + (b >> 32), base + (d >> 32));      /* 3, 7 */
    __m256d t01 = _mm256_castps_pd(_mm256_unpacklo_ps(r0, r1));
    __m256d t23 = _mm256_castps_pd(_mm256_unpacklo_ps(r2, r3));
    __m256d h01 = _mm256_castps_pd(_mm256_unpackhi_ps(r0, r1));
    __m256d h23 = _mm256_castps_pd(_mm256_unpackhi_ps(r2, r3));
    __m256 t = _mm256_castpd_ps(_mm256_unpacklo_pd(t01, t23));
    __m256 lo_val = _mm256_castpd_ps(_mm256_unpackhi_pd(t01, t23));
    __m256 hi_val = _mm256_castpd_ps(_mm256_unpacklo_pd(h01, h23));
    __m256i code = _mm256_castpd_si256(_mm256_unpackhi_pd(h01, h23));
    __m256 above = _mm256_cmp_ps(u, t, _CMP_GT_OQ);
    *codes = _mm256_add_epi32(code, _mm256_and_si256(_mm256_castps_si256(above), _mm256_srli_epi32(code, 16)));
    return _mm256_blendv_ps(lo_val, hi_val, above);
}

/* the low byte of each lane, stored as eight bytes */
static inline void vstore_codes(uint8_t *dst, __m256i k) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i s = _mm256_shuffle_epi8(k, pick);
    _mm_storel_epi64((__m128i *)dst, _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
}

static inline uint32_t hmax_u32(__m256i v) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif /* GEFEN_AVX2 */

/* How pass B gets each element's stepsize: one per block, or factored (SPEC 1.9.3 steps 5-7). */
typedef struct {
    float block_scale;        /* block mode: r32(r32(mag * ss) * lr) */
    float factored_scale;     /* factored: r32(mag * lr) */
    const float *row_root;    /* factored: sqrt(v_row / mu / bc2) per row, else NULL */
    const float *col_root;    /* factored: sqrt(v_col) per column */
    int64_t cols;
    float inv_bias1, eps;
} Stepsize;

/*
 * DEFINE_KERNELS(S, T, VEC): the kernels for storage type T (suffix S); VEC is 1 where the
 * AVX2 loops exist for T. Each loop has a scalar tail with the same operations.
 */
#define DEFINE_KERNELS(S, T, VEC)                                                                 \
                                                                                                 \
/* Pass A over [j0, j1) of a block: returns max |upd| as bits; *sum += squares (if sum).     \
   keep: where to store the lerps (indexed from j0), or NULL. */                               \
static uint32_t pass_a_##S(const T *restrict g, const uint8_t *restrict idx, const float *restrict decode, \
                           int64_t j0, int64_t j1, float old, float w, int small,                \
                           float *restrict keep, float *sum) {                                   \
    uint32_t top = 0;                                                                            \
    float total = 0.0f;                                                                          \
    int64_t j = j0;                                                                              \
    if (VEC) {                                                                                   \
        GEFEN_PASS_A_VECTOR(S)                                                                   \
    }                                                                                            \
    for (; j < j1; j++) {                                                                        \
        float x = LOAD_##S(g[j]);                                                                \
        if (sum) total += SQUARE_##S(x);                                                         \
        float upd = lerp32(decode[idx[j]] * old, x, w, small);                                   \
        if (keep) keep[j - j0] = upd;                                                            \
        uint32_t bits = f32_bits(upd) & 0x7FFFFFFFu;                                             \
        top = bits > top ? bits : top;                                                           \
    }                                                                                            \
    if (sum) *sum += total;                                                                      \
    return top;                                                                                  \
}                                                                                                \
                                                                                                 \
/* Pass B over [j0, j1) of a block whose first element is element `base` of the parameter.  \
   kept: the lerps from pass A (indexed from j0), or NULL to recompute them. */                \
static void pass_b_##S(T *restrict p, const T *restrict g, uint8_t *restrict idx, const Table *tab, \
                       int64_t base, int64_t j0, int64_t j1, float old, float mag,              \
                       const float *restrict kept, const Stepsize *st, const Hyper *h) {         \
    const float *restrict decode = tab->decode;                                                  \
    const int small = fabsf(h->w) < 0.5f;                                                        \
    const int positive = mag > 0.0f;                                                             \
    int64_t j = j0;                                                                              \
    while (j < j1) {                                                                             \
        /* a segment of one row (factored) or the whole range (block) */                       \
        int64_t end = j1;                                                                        \
        const int64_t seg0 = j;                                                                  \
        float row_root = 0.0f;                                                                   \
        const float *restrict col_root = NULL; /* indexed by j - seg0 */                         \
        if (st->row_root) {                                                                      \
            int64_t e = base + j, r = e / st->cols, c = e - r * st->cols;                        \
            end = j + (st->cols - c) < j1 ? j + (st->cols - c) : j1;                             \
            row_root = st->row_root[r];                                                          \
            col_root = st->col_root + c;                                                         \
        }                                                                                        \
        if (VEC && tab->use_cells) {                                                             \
            GEFEN_PASS_B_VECTOR(S)                                                               \
        }                                                                                        \
        for (; j < end; j++) {                                                                   \
            float upd = kept ? kept[j - j0] : lerp32(decode[idx[j]] * old, LOAD_##S(g[j]), h->w, small); \
            float ratio = upd / mag;                                                             \
            float q;                                                                             \
            idx[j] = nearest_code(positive ? ratio : 0.0f, tab, &q);                             \
            float delta = col_root                                                               \
                ? (q * (st->inv_bias1 / (row_root * col_root[j - seg0] + st->eps))) * st->factored_scale \
                : q * st->block_scale;                                                           \
            float pv = LOAD_##S(p[j]);                                                           \
            if (h->apply_decay) pv = ROUND_##S(pv * h->decay);                                   \
            p[j] = STORE_##S(pv - delta);                                                        \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* The block stepsize (SPEC 1.8.3, 1.8.7) from the block's sum of squares; updates vmean. */  \
static inline float block_stepsize_##S(float sum, int64_t period, float *vmean, const Hyper *h) { \
    float mean_square = SQUARE_MEAN_##S(sum / (float)period);                                    \
    float v = fmaf(h->one_minus_beta2, mean_square, *vmean * h->beta2);                          \
    *vmean = v;                                                                                  \
    return (1.0f / ((sqrtf(v) / h->bias2) + h->eps)) * h->inv_bias1;                             \
}                                                                                                \
                                                                                                 \
/* One parameter's blocks. block mode: vmean != NULL; factored: fac != NULL (row/col roots). */ \
static int momentum_step_##S(T *p, const T *g, uint8_t *idx, float *magnitude, float *vmean,     \
                             int64_t blocks, int64_t period, const Table *tab, const Hyper *h,   \
                             const Stepsize *fac) {                                              \
    const int small = fabsf(h->w) < 0.5f;                                                        \
    int threads = h->threads < 1 ? 1 : h->threads;                                               \
    if (period <= KEEP_MAX) {                                                                    \
        if (threads > blocks) threads = (int)blocks;                                             \
        size_t stride = ((size_t)period + 15) & ~(size_t)15;                                     \
        float *scratch = (float *)aligned_alloc(64, (size_t)threads * stride * sizeof(float)); \
        if (!scratch) return -1;                                                                 \
        _Pragma("omp parallel num_threads(threads)")                                             \
        {                                                                                        \
            int t = 0, nt = 1;                                                                   \
            GEFEN_THREAD_IDS(t, nt);                                                             \
            (void)nt;                                                                            \
            float *keep = scratch + (size_t)t * stride;                                          \
            _Pragma("omp for schedule(static)")                                                  \
            for (int64_t b = 0; b < blocks; b++) {                                               \
                const int64_t base = b * period;                                                 \
                float old = magnitude[b], sum = 0.0f;                                            \
                uint32_t top = pass_a_##S(g + base, idx + base, tab->decode, 0, period, old, h->w, small, \
                                          keep, vmean ? &sum : NULL);                            \
                float mag = bits_f32(top);                                                       \
                magnitude[b] = mag;                                                              \
                Stepsize st;                                                                     \
                if (fac) { st = *fac; st.factored_scale = mag * h->lr; }                         \
                else {                                                                           \
                    memset(&st, 0, sizeof st);                                                   \
                    st.block_scale = (mag * block_stepsize_##S(sum, period, vmean + b, h)) * h->lr; \
                }                                                                                \
                pass_b_##S(p + base, g + base, idx + base, tab, base, 0, period, old, mag, keep, &st, h); \
            }                                                                                    \
        }                                                                                        \
        free(scratch);                                                                           \
        return 0;                                                                                \
    }                                                                                            \
    /* large blocks: every thread takes a slice of each block */                                \
    uint32_t tops[2][256];                                                                       \
    float sums[2][256];                                                                          \
    if (threads > 256) threads = 256;                                                            \
    _Pragma("omp parallel num_threads(threads)")                                                 \
    {                                                                                            \
        int t = 0, nt = 1;                                                                       \
        GEFEN_THREAD_IDS(t, nt);                                                                 \
        for (int64_t b = 0; b < blocks; b++) {                                                   \
            const int64_t base = b * period;                                                     \
            const int64_t j0 = period * t / nt, j1 = period * (t + 1) / nt;                      \
            const int parity = (int)(b & 1);                                                     \
            float old = magnitude[b];                                                            \
            float old_v = vmean ? vmean[b] : 0.0f;                                               \
            float part = 0.0f;                                                                   \
            tops[parity][t] = pass_a_##S(g + base, idx + base, tab->decode, j0, j1, old, h->w, small, NULL, \
                                         vmean ? &part : NULL);                                  \
            sums[parity][t] = part;                                                              \
            _Pragma("omp barrier")                                                               \
            uint32_t top = 0;                                                                    \
            float sum = 0.0f;                                                                    \
            for (int i = 0; i < nt; i++) {                                                       \
                top = tops[parity][i] > top ? tops[parity][i] : top;                             \
                sum += sums[parity][i];                                                          \
            }                                                                                    \
            float mag = bits_f32(top);                                                           \
            Stepsize st;                                                                         \
            if (fac) { st = *fac; st.factored_scale = mag * h->lr; }                             \
            else {                                                                               \
                memset(&st, 0, sizeof st);                                                       \
                st.block_scale = (mag * block_stepsize_##S(sum, period, &old_v, h)) * h->lr;     \
            }                                                                                    \
            pass_b_##S(p + base, g + base, idx + base, tab, base, j0, j1, old, mag, NULL, &st, h); \
            if (t == 0) {                                                                        \
                magnitude[b] = mag;                                                              \
                if (vmean) vmean[b] = old_v;                                                     \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    return 0;                                                                                    \
}                                                                                                \
                                                                                                 \
/* SPEC 1.8: one block-vmean step of a flat parameter, in place. Returns 0, or -1 when the   \
   scratch could not be allocated (then nothing was changed). */                                \
int gefen_block_step_##S(T *p, const T *g, uint8_t *idx, float *magnitude, float *vmean,        \
                         int64_t blocks, int64_t period, const Table *tab, const Hyper *h) {     \
    return momentum_step_##S(p, g, idx, magnitude, vmean, blocks, period, tab, h, NULL);        \
}                                                                                                \
                                                                                                 \
/* SPEC 1.9.3 steps 3-5; returns mu = max(mean(v_row), FLT_MIN), or -1 when out of memory    \
   (then nothing was changed). Column sums: one partial per thread, added in thread order. */  \
float gefen_factored_moments_##S(const T *g, int64_t rows, int64_t cols, float *v_row,          \
                                 float *v_col, const Hyper *h) {                                 \
    int threads = h->threads < 1 ? 1 : h->threads;                                               \
    if (threads > rows) threads = (int)rows;                                                     \
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
                float x = LOAD_##S(gr[c]);                                                       \
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
int gefen_factored_step_##S(T *p, const T *g, uint8_t *idx, float *magnitude,                   \
                            int64_t blocks, int64_t period, int64_t cols,                        \
                            const float *v_row, const float *v_col, float mu,                    \
                            const Table *tab, const Hyper *h) {                                  \
    int64_t rows = blocks * period / cols;                                                       \
    float *roots = (float *)malloc((size_t)(rows + cols) * sizeof(float));                       \
    if (!roots) return -1;                                                                       \
    for (int64_t r = 0; r < rows; r++) roots[r] = sqrtf((v_row[r] / mu) / h->bias2);             \
    for (int64_t c = 0; c < cols; c++) roots[rows + c] = sqrtf(v_col[c]);                        \
    Stepsize fac;                                                                                \
    memset(&fac, 0, sizeof fac);                                                                 \
    fac.row_root = roots;                                                                        \
    fac.col_root = roots + rows;                                                                 \
    fac.cols = cols;                                                                             \
    fac.inv_bias1 = h->inv_bias1;                                                                \
    fac.eps = h->eps;                                                                            \
    int status = momentum_step_##S(p, g, idx, magnitude, NULL, blocks, period, tab, h, &fac);   \
    free(roots);                                                                                 \
    return status;                                                                               \
}

/* ------------------------------------------------------------------- vector loop bodies */
#if GEFEN_AVX2
#define GEFEN_PASS_A_VECTOR(S)                                                                   \
    const __m256 vold = _mm256_set1_ps(old), vw = _mm256_set1_ps(w);                             \
    const __m256 vnw = _mm256_set1_ps(-(1.0f - w));                                              \
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);                                       \
    __m256i vtop = _mm256_setzero_si256();                                                       \
    __m256 vsum = _mm256_setzero_ps();                                                           \
    for (; j + 8 <= j1; j += 8) {                                                                \
        __m256 x = vload_##S(g + j);                                                             \
        if (sum) vsum = _mm256_add_ps(vsum, vsquare_##S(x));                                     \
        __m256 cur = _mm256_mul_ps(vdecode(decode, idx + j), vold);                              \
        __m256 d = _mm256_sub_ps(x, cur);                                                        \
        __m256 upd = small ? _mm256_fmadd_ps(vw, d, cur) : _mm256_fmadd_ps(vnw, d, x);           \
        if (keep) _mm256_storeu_ps(keep + (j - j0), upd);                                        \
        vtop = _mm256_max_epu32(vtop, _mm256_and_si256(_mm256_castps_si256(upd), absmask));      \
    }                                                                                            \
    top = hmax_u32(vtop);                                                                        \
    if (sum) total = hsum_ps(vsum);

#define GEFEN_PASS_B_VECTOR(S)                                                                   \
    {                                                                                            \
        const __m256 vmag = _mm256_set1_ps(mag), vold = _mm256_set1_ps(old);                     \
        const __m256 vw = _mm256_set1_ps(h->w), vnw = _mm256_set1_ps(-(1.0f - h->w));            \
        const __m256 vdecay = _mm256_set1_ps(h->decay);                                          \
        const __m256 vblock = _mm256_set1_ps(st->block_scale);                                   \
        const __m256 vfscale = _mm256_set1_ps(st->factored_scale);                               \
        const __m256 vrow = _mm256_set1_ps(row_root), veps = _mm256_set1_ps(st->eps);            \
        const __m256 vib1 = _mm256_set1_ps(st->inv_bias1);                                       \
        for (; j + 8 <= end; j += 8) {                                                           \
            __m256 upd;                                                                          \
            if (kept) upd = _mm256_loadu_ps(kept + (j - j0));                                    \
            else {                                                                               \
                __m256 x = vload_##S(g + j);                                                     \
                __m256 cur = _mm256_mul_ps(vdecode(decode, idx + j), vold);                      \
                __m256 d = _mm256_sub_ps(x, cur);                                                \
                upd = small ? _mm256_fmadd_ps(vw, d, cur) : _mm256_fmadd_ps(vnw, d, x);          \
            }                                                                                    \
            __m256 u = positive ? _mm256_div_ps(upd, vmag) : _mm256_setzero_ps();                \
            __m256i k;                                                                           \
            __m256 q = vnearest(u, tab->cells, &k);                                              \
            vstore_codes(idx + j, k);                                                            \
            __m256 delta;                                                                        \
            if (col_root) {                                                                      \
                __m256 den = _mm256_add_ps(_mm256_mul_ps(vrow, _mm256_loadu_ps(col_root + (j - seg0))), veps); \
                delta = _mm256_mul_ps(_mm256_mul_ps(q, _mm256_div_ps(vib1, den)), vfscale);      \
            } else {                                                                             \
                delta = _mm256_mul_ps(q, vblock);                                                \
            }                                                                                    \
            __m256 pv = vload_##S(p + j);                                                        \
            if (h->apply_decay) pv = vround_##S(_mm256_mul_ps(pv, vdecay));                      \
            vstore_##S(p + j, _mm256_sub_ps(pv, delta));                                         \
        }                                                                                        \
    }
#else
#define GEFEN_PASS_A_VECTOR(S)
#define GEFEN_PASS_B_VECTOR(S)
#endif

#if GEFEN_AVX2
DEFINE_KERNELS(f32, float, 1)
DEFINE_KERNELS(bf16, uint16_t, 1)
#else
DEFINE_KERNELS(f32, float, 0)
DEFINE_KERNELS(bf16, uint16_t, 0)
#endif

#if GEFEN_HALF
#if GEFEN_AVX2 && GEFEN_VECTOR_F16
DEFINE_KERNELS(f16, uint16_t, 1)
#else
#undef GEFEN_PASS_A_VECTOR
#undef GEFEN_PASS_B_VECTOR
#define GEFEN_PASS_A_VECTOR(S)
#define GEFEN_PASS_B_VECTOR(S)
DEFINE_KERNELS(f16, uint16_t, 0)
#endif
#endif

/* The codes and decoded values of n normalised values, by the same lookups as pass B (for tests). */
void gefen_nearest_codes(const float *u, int64_t n, const Table *tab, uint8_t *codes, float *decoded) {
    int64_t j = 0;
#if GEFEN_AVX2
    if (tab->use_cells) {
        for (; j + 8 <= n; j += 8) {
            __m256i k;
            _mm256_storeu_ps(decoded + j, vnearest(_mm256_loadu_ps(u + j), tab->cells, &k));
            vstore_codes(codes + j, k);
        }
    }
#endif
    for (; j < n; j++) codes[j] = nearest_code(u[j], tab, decoded + j);
}

/* What this build offers: bit 0 AVX2 loops, bit 1 fp16 kernels. */
int gefen_capabilities(void) { return (GEFEN_AVX2 ? 1 : 0) | (GEFEN_HALF ? 2 : 0); }
int gefen_abi_version(void) { return GEFEN_ABI_VERSION; }
