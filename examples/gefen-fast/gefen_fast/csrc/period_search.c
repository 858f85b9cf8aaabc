/*
 * Block statistics for the exact period search (SPEC 1.5.3-1.5.5), computed in one pass over the
 * gradient per prime factor of its size.
 *
 * The search scores every proper divisor p of n by E(p) = sqrt(mean over blocks of each block's
 * population variance) of x = widen64(r32(r32(g)^2)). Since the variances are taken over equal
 * blocks, E(p)^2 = (T - G(p)/p) / n with T = sum x^2 and G(p) = sum over blocks of (block sum)^2.
 * These kernels return T and G(p) for a list of periods; Python turns them into E(p) with a
 * rigorous error bound and decides the period only where the bound proves numpy's choice
 * (gefen_fast/period_search.py), else it runs the reference's numpy search.
 *
 * A period's block sums are computed from the raw gradient ("source" -1) or from the block sums
 * of a smaller period that divides it (its "source" level), so most levels cost n / source work.
 * All sums are of non-negative float64 terms (any order is covered by the error bound). Levels
 * are kept only while a later level still derives from them.
 */
#include "gefen_common.h"

#define LOAD_f32(x) (x)
#define LOAD_bf16(x) bf16_f32(x)
#if GEFEN_HALF
#define LOAD_f16(x) f16_f32(x)
#endif

/* Status codes shared with Python. */
#define PERIOD_OK 0
#define PERIOD_NO_MEMORY -1
#define PERIOD_NOT_FINITE -2
#define PERIOD_BAD_PLAN -3

/*
 * level_sums_S: block sums (length n / period, if sums != NULL) of x over blocks of `period`,
 * their sum of squares (*g_out) and, if t_out, sum x^2. Returns PERIOD_NOT_FINITE when some x
 * is not finite (an infinite or NaN gradient, or a square beyond fp32).
 */
#define DEFINE_LEVEL_SUMS(S, T)                                                                   \
static int level_sums_##S(const T *g, int64_t n, int64_t period, double *sums, double *g_out,   \
                          double *t_out, int threads) {                                          \
    const int64_t blocks = n / period;                                                           \
    threads = gefen_threads_for(n, threads);                                                     \
    double square_total = 0.0, x2_total = 0.0;                                                   \
    int bad = 0;                                                                                 \
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(+:square_total,x2_total) reduction(|:bad)") \
    for (int64_t b = 0; b < blocks; b++) {                                                       \
        const T *gb = g + b * period;                                                            \
        double s = 0.0, q = 0.0;                                                                 \
        _Pragma("omp simd reduction(+:s,q)")                                                     \
        for (int64_t j = 0; j < period; j++) {                                                   \
            float y = LOAD_##S(gb[j]);                                                           \
            double x = (double)(y * y);                                                          \
            s += x;                                                                              \
            q += x * x;                                                                          \
        }                                                                                        \
        if (!isfinite(s) || !isfinite(q)) bad = 1;                                               \
        if (sums) sums[b] = s;                                                                   \
        square_total += s * s;                                                                   \
        x2_total += q;                                                                           \
    }                                                                                            \
    *g_out = square_total;                                                                       \
    if (t_out) *t_out = x2_total;                                                                \
    return bad ? PERIOD_NOT_FINITE : PERIOD_OK;                                                  \
}

/*
 * tile_sums_S: the levels of a chain p_1 | p_2 | ... | p_k = tile (tile <= MAX_TILE) in one pass:
 * each tile's x is summed in registers level by level, G(p_i) accumulated, and only the tile
 * sums are stored (if sums != NULL). Also sum x^2 into *t_out.
 */
#define MAX_TILE 256
#define DEFINE_TILE_SUMS(S, T)                                                                    \
static int tile_sums_##S(const T *g, int64_t n, const int64_t *chain, int32_t k, double *sums,  \
                         double *g_out, double *t_out, int threads) {                             \
    const int64_t tile = chain[k - 1], tiles = n / tile;                                         \
    threads = gefen_threads_for(n, threads);                                                     \
    double totals[64] = {0}, x2_total = 0.0;                                                     \
    int bad = 0;                                                                                 \
    _Pragma("omp parallel num_threads(threads) reduction(+:x2_total) reduction(|:bad)")          \
    {                                                                                            \
        double local[64] = {0};                                                                  \
        double level[MAX_TILE], other[MAX_TILE];                                                 \
        _Pragma("omp for schedule(static)")                                                      \
        for (int64_t b = 0; b < tiles; b++) {                                                    \
            const T *gb = g + b * tile;                                                          \
            double q = 0.0;                                                                      \
            _Pragma("omp simd reduction(+:q)")                                                   \
            for (int64_t j = 0; j < tile; j++) {                                                 \
                float y = LOAD_##S(gb[j]);                                                       \
                double x = (double)(y * y);                                                      \
                level[j] = x;                                                                    \
                q += x * x;                                                                      \
            }                                                                                    \
            if (!isfinite(q)) bad = 1;                                                           \
            x2_total += q;                                                                       \
            int64_t width = 1, count = tile;                                                     \
            double *from = level, *to = other;                                                   \
            for (int32_t i = 0; i < k; i++) {                                                    \
                const int64_t ratio = chain[i] / width;                                          \
                count /= ratio;                                                                  \
                double squares = 0.0;                                                            \
                if (ratio == 2) {                                                                \
                    _Pragma("omp simd reduction(+:squares)")                                     \
                    for (int64_t c = 0; c < count; c++) {                                        \
                        double v = from[2 * c] + from[2 * c + 1];                                \
                        to[c] = v;                                                               \
                        squares += v * v;                                                        \
                    }                                                                            \
                } else {                                                                         \
                    for (int64_t c = 0; c < count; c++) {                                        \
                        double v = 0.0;                                                          \
                        for (int64_t r = 0; r < ratio; r++) v += from[c * ratio + r];            \
                        to[c] = v;                                                               \
                        squares += v * v;                                                        \
                    }                                                                            \
                }                                                                                \
                local[i] += squares;                                                             \
                width = chain[i];                                                                \
                double *swap = from; from = to; to = swap;                                       \
            }                                                                                    \
            if (sums) sums[b] = from[0];                                                         \
        }                                                                                        \
        _Pragma("omp critical")                                                                  \
        for (int32_t i = 0; i < k; i++) totals[i] += local[i];                                   \
    }                                                                                            \
    for (int32_t i = 0; i < k; i++) g_out[i] = totals[i];                                        \
    *t_out = x2_total;                                                                           \
    return bad ? PERIOD_NOT_FINITE : PERIOD_OK;                                                  \
}

DEFINE_TILE_SUMS(f32, float)
DEFINE_TILE_SUMS(bf16, uint16_t)
#if GEFEN_HALF
DEFINE_TILE_SUMS(f16, uint16_t)
#endif

DEFINE_LEVEL_SUMS(f32, float)
DEFINE_LEVEL_SUMS(bf16, uint16_t)
#if GEFEN_HALF
DEFINE_LEVEL_SUMS(f16, uint16_t)
#endif

/* block sums of `period` from the block sums of `source_period` (which divides it) */
static double derived_sums(const double *src, int64_t n, int64_t source_period, int64_t period,
                           double *sums, int threads) {
    const int64_t blocks = n / period, ratio = period / source_period;
    threads = gefen_threads_for(n / source_period, threads);
    double square_total = 0.0;
    _Pragma("omp parallel for num_threads(threads) schedule(static) reduction(+:square_total)")
    for (int64_t b = 0; b < blocks; b++) {
        const double *sb = src + b * ratio;
        double s = 0.0;
        _Pragma("omp simd reduction(+:s)")
        for (int64_t i = 0; i < ratio; i++) s += sb[i];
        if (sums) sums[b] = s;
        square_total += s * s;
    }
    return square_total;
}

/*
 * gefen_period_statistics_S(g, n, periods, sources, last_use, count, g_out, t_out, threads):
 * for each of `count` periods (each dividing n), G(p) into g_out[i]; T into *t_out.
 * sources[i]: -2 (the first entries only: a chain, each dividing the next, the last at most
 * MAX_TILE, summed tile by tile in one pass), -1 (from the gradient) or the index j < i of a
 * period dividing periods[i] (a chain entry only if it is the chain's last);
 * last_use[i]: the last index whose source is i (or -1: no level is kept for it).
 */
#define DEFINE_STATISTICS(S, T)                                                                   \
int gefen_period_statistics_##S(const T *g, int64_t n, const int64_t *periods,                   \
                                const int32_t *sources, const int32_t *last_use, int32_t count,   \
                                double *g_out, double *t_out, int32_t threads) {                \
    if (threads < 1) threads = 1;                                                                \
    double **levels = (double **)calloc((size_t)(count > 0 ? count : 1), sizeof(double *));      \
    if (!levels) return PERIOD_NO_MEMORY;                                                        \
    int status = PERIOD_OK, have_t = 0;                                                          \
    *t_out = 0.0;                                                                                \
    int32_t chain = 0;                                                                           \
    while (chain < count && sources[chain] == -2) chain++;                                       \
    if (chain > 64 || (chain > 0 && (periods[chain - 1] > MAX_TILE || n % periods[chain - 1]))) status = PERIOD_BAD_PLAN; \
    for (int32_t i = 1; i < chain && status == PERIOD_OK; i++)                                   \
        if (periods[i] % periods[i - 1]) status = PERIOD_BAD_PLAN;                               \
    if (chain > 0 && status == PERIOD_OK) {                                                      \
        double *sums = NULL;                                                                     \
        if (last_use[chain - 1] >= chain) {                                                      \
            sums = (double *)malloc((size_t)(n / periods[chain - 1]) * sizeof(double));          \
            if (!sums) status = PERIOD_NO_MEMORY;                                                \
        }                                                                                        \
        if (status == PERIOD_OK) {                                                               \
            int64_t chain_periods[64];                                                           \
            for (int32_t i = 0; i < chain; i++) chain_periods[i] = periods[i];                   \
            status = tile_sums_##S(g, n, chain_periods, chain, sums, g_out, t_out, threads);     \
            have_t = 1;                                                                          \
            levels[chain - 1] = sums;                                                            \
        }                                                                                        \
    }                                                                                            \
    for (int32_t i = chain; i < count && status == PERIOD_OK; i++) {                             \
        const int64_t p = periods[i];                                                            \
        const int32_t src = sources[i];                                                          \
        if (p < 1 || n % p != 0 || src >= i || src < -1 || (src >= 0 && (!levels[src] || p % periods[src]))) { \
            status = PERIOD_BAD_PLAN;                                                            \
            break;                                                                               \
        }                                                                                        \
        double *sums = NULL;                                                                     \
        if (last_use[i] > i) {                                                                   \
            sums = (double *)malloc((size_t)(n / p) * sizeof(double));                           \
            if (!sums) { status = PERIOD_NO_MEMORY; break; }                                     \
        }                                                                                        \
        if (src < 0) {                                                                           \
            status = level_sums_##S(g, n, p, sums, g_out + i, have_t ? NULL : t_out, threads);  \
            have_t = 1;                                                                          \
        } else {                                                                                 \
            g_out[i] = derived_sums(levels[src], n, periods[src], p, sums, threads);             \
        }                                                                                        \
        levels[i] = sums;                                                                        \
        for (int32_t j = 0; j <= i; j++)                                                         \
            if (levels[j] && last_use[j] <= i) { free(levels[j]); levels[j] = NULL; }            \
    }                                                                                            \
    if (status == PERIOD_OK && !have_t) {                                                        \
        double unused;                                                                           \
        status = level_sums_##S(g, n, n, NULL, &unused, t_out, threads);                         \
    }                                                                                            \
    for (int32_t j = 0; j < count; j++) free(levels[j]);                                         \
    free(levels);                                                                                \
    return status;                                                                               \
}

DEFINE_STATISTICS(f32, float)
DEFINE_STATISTICS(bf16, uint16_t)
#if GEFEN_HALF
DEFINE_STATISTICS(f16, uint16_t)
#endif
