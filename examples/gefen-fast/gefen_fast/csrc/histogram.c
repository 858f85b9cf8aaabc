/*
 * The codebook histogram of one gradient (SPEC 1.6.4): each block of `period` elements of the
 * fp32 gradient y is normalised by its absolute maximum a (u = r32(y / a), or 0 when a == 0), and
 * u lands in bin floor(r32(u + 1) * 2048) clamped to [0, 4095]. The counts are exact integers, so
 * they equal the reference's whatever the order; they are added into `counts` (int64[4096]).
 *
 * Gradients that are not finite are outside the conformance domain (SPEC 0.4.4); the kernel
 * reports them and Python uses the reference's torch histogram for that gradient.
 */
#include "gefen_common.h"

#define HISTOGRAM_BINS 4096
#define STAGE 512
/* per-thread counts are uint32, flushed into int64 before they could overflow */
#define FLUSH_EVERY ((int64_t)1 << 30)

#define HIST_OK 0
#define HIST_NO_MEMORY -1
#define HIST_NOT_FINITE -2

#define LOAD_f32(x) (x)
#define LOAD_bf16(x) bf16_f32(x)
#if GEFEN_HALF
#define LOAD_f16(x) f16_f32(x)
#endif

/* two interleaved sub-histograms, so that runs of equal bins do not serialise on one counter */
typedef struct {
    uint32_t even[HISTOGRAM_BINS];
    uint32_t odd[HISTOGRAM_BINS];
    int64_t pending;
} Local;

static void flush(Local *local, int64_t *total) {
    for (int i = 0; i < HISTOGRAM_BINS; i++) {
        total[i] += (int64_t)local->even[i] + (int64_t)local->odd[i];
        local->even[i] = local->odd[i] = 0;
    }
    local->pending = 0;
}

#define DEFINE_HISTOGRAM(S, T)                                                                    \
/* max |y| over [j0, j1) as bits (exact; a NaN makes it exceed the infinity pattern) */          \
static uint32_t absmax_##S(const T *g, int64_t j0, int64_t j1) {                                 \
    uint32_t top = 0;                                                                            \
    _Pragma("omp simd reduction(max:top)")                                                       \
    for (int64_t j = j0; j < j1; j++) {                                                          \
        uint32_t bits = f32_bits(LOAD_##S(g[j])) & 0x7FFFFFFFu;                                  \
        top = bits > top ? bits : top;                                                           \
    }                                                                                            \
    return top;                                                                                  \
}                                                                                                \
                                                                                                 \
static void count_##S(const T *g, int64_t j0, int64_t j1, float a, Local *local, int64_t *total) { \
    uint16_t bins[STAGE];                                                                        \
    for (int64_t s0 = j0; s0 < j1; s0 += STAGE) {                                                \
        int64_t m = j1 - s0 < STAGE ? j1 - s0 : STAGE;                                           \
        if (a > 0.0f) {                                                                          \
            _Pragma("omp simd")                                                                  \
            for (int64_t j = 0; j < m; j++) {                                                    \
                float u = LOAD_##S(g[s0 + j]) / a;                                               \
                float x = (u + 1.0f) * 2048.0f; /* in [0, 4096]: truncation is the floor */     \
                int32_t k = (int32_t)x;                                                          \
                bins[j] = (uint16_t)(k < HISTOGRAM_BINS - 1 ? k : HISTOGRAM_BINS - 1);           \
            }                                                                                    \
        } else {                                                                                 \
            for (int64_t j = 0; j < m; j++) bins[j] = HISTOGRAM_BINS / 2;                        \
        }                                                                                        \
        int64_t j = 0;                                                                           \
        for (; j + 2 <= m; j += 2) {                                                             \
            local->even[bins[j]]++;                                                              \
            local->odd[bins[j + 1]]++;                                                           \
        }                                                                                        \
        if (j < m) local->even[bins[j]]++;                                                       \
        local->pending += m;                                                                     \
        if (local->pending >= FLUSH_EVERY) flush(local, total);                                  \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
int gefen_histogram_##S(const T *g, int64_t n, int64_t period, int64_t *counts, int32_t threads) { \
    threads = gefen_threads_for(n, threads);                                                     \
    const int64_t blocks = n / period;                                                           \
    Local *locals = (Local *)calloc((size_t)threads, sizeof(Local));                             \
    int64_t *totals = (int64_t *)calloc((size_t)threads * HISTOGRAM_BINS, sizeof(int64_t));      \
    if (!locals || !totals) { free(locals); free(totals); return HIST_NO_MEMORY; }               \
    int bad = 0;                                                                                 \
    if (blocks >= 4 * (int64_t)threads) {                                                        \
        _Pragma("omp parallel num_threads(threads) reduction(|:bad)")                            \
        {                                                                                        \
            int t = 0, nt = 1;                                                                   \
            GEFEN_THREAD_IDS(t, nt);                                                             \
            (void)nt;                                                                            \
            _Pragma("omp for schedule(static)")                                                  \
            for (int64_t b = 0; b < blocks; b++) {                                               \
                const T *gb = g + b * period;                                                    \
                uint32_t top = absmax_##S(gb, 0, period);                                        \
                if (top >= 0x7F800000u) { bad = 1; continue; }                                   \
                count_##S(gb, 0, period, bits_f32(top), locals + t, totals + (size_t)t * HISTOGRAM_BINS); \
            }                                                                                    \
            flush(locals + t, totals + (size_t)t * HISTOGRAM_BINS);                              \
        }                                                                                        \
    } else {                                                                                     \
        /* few large blocks: every thread takes a slice of each block */                        \
        uint32_t tops[256];                                                                      \
        if (threads > 256) threads = 256;                                                        \
        _Pragma("omp parallel num_threads(threads) reduction(|:bad)")                            \
        {                                                                                        \
            int t = 0, nt = 1;                                                                   \
            GEFEN_THREAD_IDS(t, nt);                                                             \
            for (int64_t b = 0; b < blocks; b++) {                                               \
                const T *gb = g + b * period;                                                    \
                const int64_t j0 = period * t / nt, j1 = period * (t + 1) / nt;                  \
                tops[t] = absmax_##S(gb, j0, j1);                                                \
                _Pragma("omp barrier")                                                           \
                uint32_t top = 0;                                                                \
                for (int i = 0; i < nt; i++) top = tops[i] > top ? tops[i] : top;                \
                _Pragma("omp barrier")                                                           \
                if (top >= 0x7F800000u) { bad = 1; continue; }                                   \
                count_##S(gb, j0, j1, bits_f32(top), locals + t, totals + (size_t)t * HISTOGRAM_BINS); \
            }                                                                                    \
            flush(locals + t, totals + (size_t)t * HISTOGRAM_BINS);                              \
        }                                                                                        \
    }                                                                                            \
    if (!bad)                                                                                    \
        for (int t = 0; t < threads; t++)                                                        \
            for (int i = 0; i < HISTOGRAM_BINS; i++) counts[i] += totals[(size_t)t * HISTOGRAM_BINS + i]; \
    free(locals);                                                                                \
    free(totals);                                                                                \
    return bad ? HIST_NOT_FINITE : HIST_OK;                                                      \
}

DEFINE_HISTOGRAM(f32, float)
DEFINE_HISTOGRAM(bf16, uint16_t)
#if GEFEN_HALF
DEFINE_HISTOGRAM(f16, uint16_t)
#endif
