/*
 * The optimal codebook of SPEC 1.6.8 (the DP case, K <= m active bins), bit for bit.
 *
 * Every float64 operation is the one SPEC 1.6.8 fixes (sequential prefix sums, the three cost
 * formulas evaluated left to right, strict-< scans so ties go to the smallest start), built with
 * -ffp-contract=off so nothing is fused. The interior layers use the same error-bounded monotone
 * divide and conquer as the reference's default solver (reference/codebook_solver.py,
 * _interior_layer): for the middle end of a range every start in its window is scanned; the
 * windows of the ends on either side are cut at the starts whose candidate is within `tol` of the
 * minimum, with tol = 5 * 16u(max|prev| + cost scale). The reference proves that such a cut
 * never removes the leftmost minimiser, so the result is the full scan's. Where the proof's
 * premise (non-decreasing per-bin means with a margin) fails, or a count vanishes in the running
 * sum, this returns a status and Python runs the reference solver instead.
 */
#include "gefen_common.h"

#define DP_OK 0
#define DP_NO_MEMORY -1
#define DP_PREMISE -2   /* the monotone search does not apply: use the reference solver */
#define DP_LOST_COUNT -3 /* a count vanished in the float64 sum (the reference raises) */
#define DP_BAD_INPUT -4

static const double U = 1.0 / 9007199254740992.0; /* 2**-53 */

typedef struct {
    const double *PW, *PX, *PXX, *prev;
    double *dp;
    int16_t *start_of;   /* this layer's row */
    double tol;
} Layer;

static inline double free_cost(double sxx, double sx, double sw) { return sxx - (sx * sx) / sw; }

/* cand[s - s_lo] for starts s_lo..top of end e (a loop the compiler vectorises) */
static void evaluate(const Layer *L, int64_t e, int64_t s_lo, int64_t top, double *restrict cand) {
    const double pw = L->PW[e], px = L->PX[e], pxx = L->PXX[e];
    const double *restrict PW = L->PW + s_lo - 1, *restrict PX = L->PX + s_lo - 1;
    const double *restrict PXX = L->PXX + s_lo - 1, *restrict prev = L->prev + s_lo - 1;
    const int64_t count = top - s_lo + 1;
    for (int64_t i = 0; i < count; i++)
        cand[i] = prev[i] + free_cost(pxx - PXX[i], px - PX[i], pw - PW[i]);
}

/* the minimum of cand[0..count) (all finite) */
static double minimum(const double *cand, int64_t count) {
    int64_t i = 0;
    double best = INFINITY;
#if GEFEN_AVX2
    if (count >= 8) {
        __m256d a = _mm256_loadu_pd(cand), b = _mm256_loadu_pd(cand + 4);
        for (i = 8; i + 8 <= count; i += 8) {
            a = _mm256_min_pd(a, _mm256_loadu_pd(cand + i));
            b = _mm256_min_pd(b, _mm256_loadu_pd(cand + i + 4));
        }
        a = _mm256_min_pd(a, b);
        __m128d m = _mm_min_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
        m = _mm_min_sd(m, _mm_unpackhi_pd(m, m));
        best = _mm_cvtsd_f64(m);
    }
#endif
    for (; i < count; i++) best = cand[i] < best ? cand[i] : best;
    return best;
}

/* Below this many ends (and a window this narrow) the ends are scanned directly: the window
   [s_lo, s_hi] of a range holds every end's leftmost minimiser (the cuts that made it are the
   proven ones), so the first minimum over it is the full scan's answer, without the per-midpoint
   work of the recursion. Four ends are scanned at once, one per lane, start by start. */
#define DIRECT_ENDS 8
#define DIRECT_WINDOW 256

/* ends e0..e1 (at most 4) scanned over starts s_lo..min(s_hi, end): the same float64 operations
   per candidate as the recurrence, the first strict minimum kept */
static void scan_ends(const Layer *L, int64_t e0, int64_t e1, int64_t s_lo, int64_t s_hi) {
#if GEFEN_AVX2
    {
        /* lanes past e1 get end -1: never valid (the prefix arrays are padded for their loads) */
        const __m256d pw = _mm256_loadu_pd(L->PW + e0), px = _mm256_loadu_pd(L->PX + e0);
        const __m256d pxx = _mm256_loadu_pd(L->PXX + e0);
        const __m256d ends = _mm256_setr_pd((double)e0, e0 + 1 <= e1 ? (double)(e0 + 1) : -1.0,
                                            e0 + 2 <= e1 ? (double)(e0 + 2) : -1.0, e0 + 3 <= e1 ? (double)(e0 + 3) : -1.0);
        __m256d best = _mm256_set1_pd(INFINITY), arg = _mm256_set1_pd(-1.0);
        const int64_t top = s_hi < e1 ? s_hi : e1;
        for (int64_t s = s_lo; s <= top; s++) {
            const int64_t b = s - 1;
            const __m256d sw = _mm256_sub_pd(pw, _mm256_set1_pd(L->PW[b]));
            const __m256d sx = _mm256_sub_pd(px, _mm256_set1_pd(L->PX[b]));
            const __m256d sxx = _mm256_sub_pd(pxx, _mm256_set1_pd(L->PXX[b]));
            __m256d c = _mm256_add_pd(_mm256_set1_pd(L->prev[b]),
                                      _mm256_sub_pd(sxx, _mm256_div_pd(_mm256_mul_pd(sx, sx), sw)));
            const __m256d vs = _mm256_set1_pd((double)s);
            const __m256d valid = _mm256_cmp_pd(vs, ends, _CMP_LE_OQ);
            const __m256d lower = _mm256_and_pd(valid, _mm256_cmp_pd(c, best, _CMP_LT_OQ));
            best = _mm256_blendv_pd(best, c, lower);
            arg = _mm256_blendv_pd(arg, vs, lower);
        }
        double b4[4], a4[4];
        _mm256_storeu_pd(b4, best);
        _mm256_storeu_pd(a4, arg);
        for (int i = 0; i <= e1 - e0; i++) {
            L->dp[e0 + i] = b4[i];
            L->start_of[e0 + i] = (int16_t)a4[i];
        }
        return;
    }
#endif
    for (int64_t e = e0; e <= e1; e++) {
        const int64_t top = s_hi < e ? s_hi : e;
        const double pw = L->PW[e], px = L->PX[e], pxx = L->PXX[e];
        double best = INFINITY;
        int64_t leftmost = -1;
        for (int64_t s = s_lo; s <= top; s++) {
            const int64_t b = s - 1;
            const double c = L->prev[b] + free_cost(pxx - L->PXX[b], px - L->PX[b], pw - L->PW[b]);
            if (c < best) { best = c; leftmost = s; }
        }
        L->dp[e] = best;
        L->start_of[e] = (int16_t)leftmost;
    }
}

/* The middle end of [e_lo, e_hi]: its minimum over starts [s_lo, min(s_hi, mid)], and the window
   cuts for the ends on either side (starts within tol of the minimum). Returns mid. */
static int64_t solve_mid(const Layer *L, int64_t e_lo, int64_t e_hi, int64_t s_lo, int64_t s_hi, double *cand,
                         int64_t *near_lo_out, int64_t *near_hi_out) {
    const int64_t mid = (e_lo + e_hi) >> 1;
    const int64_t top = s_hi < mid ? s_hi : mid;
    const int64_t count = top - s_lo + 1;
    evaluate(L, mid, s_lo, top, cand);
    const double best = minimum(cand, count);
    const double limit = best + L->tol;
    int64_t i = 0;
    while (!(cand[i] <= limit)) i++;
    *near_lo_out = s_lo + i;
    while (cand[i] != best) i++;
    L->dp[mid] = best;
    L->start_of[mid] = (int16_t)(s_lo + i);
    int64_t j = count - 1;
    while (!(cand[j] <= limit)) j--;
    *near_hi_out = s_lo + j;
    return mid;
}

/* ends [e_lo, e_hi] with starts limited to [s_lo, s_hi] (s <= end always) */
static void solve_range(const Layer *L, int64_t e_lo, int64_t e_hi, int64_t s_lo, int64_t s_hi, double *cand) {
    while (e_lo <= e_hi) {
        if (e_hi - e_lo < DIRECT_ENDS && s_hi - s_lo < DIRECT_WINDOW) {
            for (int64_t e = e_lo; e <= e_hi; e += 4)
                scan_ends(L, e, e + 3 <= e_hi ? e + 3 : e_hi, s_lo, s_hi);
            return;
        }
        int64_t near_lo, near_hi;
        const int64_t mid = solve_mid(L, e_lo, e_hi, s_lo, s_hi, cand, &near_lo, &near_hi);
        /* the left half recursively (smaller), the right half by iteration */
        if (e_lo < mid) solve_range(L, e_lo, mid - 1, s_lo, near_hi, cand);
        e_lo = mid + 1;
        s_lo = near_lo;
    }
}

/*
 * centers, weights: the m active bins (float64 of the fp32-rounded values, SPEC 1.6.6), m >= k.
 * Writes the k sorted fp32 codewords into out.
 */
int gefen_codebook_dp(const double *centers, const double *weights, int64_t m, int64_t k, float *out) {
    if (k < 3 || m < k || m > 32000) return DP_BAD_INPUT;
    const int64_t span = m - k;
    /* +4: scan_ends loads four ends at a time */
    double *PW = (double *)calloc((size_t)(m + 5), sizeof(double));
    double *PX = (double *)calloc((size_t)(m + 5), sizeof(double));
    double *PXX = (double *)calloc((size_t)(m + 5), sizeof(double));
    double *prev = (double *)malloc((size_t)(m + 1) * sizeof(double));
    double *next = (double *)malloc((size_t)(m + 1) * sizeof(double));
    double *scratch = (double *)malloc((size_t)(m + 1) * sizeof(double)); /* one scan's candidates */
    int16_t *start_of = (int16_t *)malloc((size_t)(k + 1) * (size_t)(m + 1) * sizeof(int16_t));
    int status = DP_OK;
    if (!PW || !PX || !PXX || !prev || !next || !scratch || !start_of) { status = DP_NO_MEMORY; goto done; }

    /* sequential prefix sums with a leading 0 (SPEC 1.6.8): w, w*c, w*(c*c) */
    PW[0] = PX[0] = PXX[0] = 0.0;
    for (int64_t i = 0; i < m; i++) {
        const double c = centers[i], w = weights[i];
        PW[i + 1] = PW[i] + w;
        PX[i + 1] = PX[i] + w * c;
        PXX[i + 1] = PXX[i] + w * (c * c);
    }
    /* a count lost in the running sum makes a single-bin run divide by Sw == 0 */
    for (int64_t i = 2; i <= m; i++)
        if (PW[i] == PW[i - 1]) { status = DP_LOST_COUNT; goto done; }
    /* the monotone search's premise: per-bin means increase by more than their error bound */
    double biggest_mean = 0.0;
    {
        double previous_mean = (PX[1] - PX[0]) / (PW[1] - PW[0]);
        biggest_mean = fabs(previous_mean);
        for (int64_t i = 2; i <= m; i++) {
            const double mean = (PX[i] - PX[i - 1]) / (PW[i] - PW[i - 1]);
            const double margin = 8.0 * U * (fabs(mean) + fabs(previous_mean));
            if (!(mean - previous_mean > margin)) { status = DP_PREMISE; goto done; }
            if (fabs(mean) > biggest_mean) biggest_mean = fabs(mean);
            previous_mean = mean;
        }
    }
    const double inflated = biggest_mean * (1.0 + 8.0 * U);
    const double cost_scale = PXX[m] + (inflated * inflated) * PW[m];

    for (int64_t i = 0; i <= m; i++) { prev[i] = INFINITY; next[i] = INFINITY; }
    /* layer 1: pinned to -1, every end starts at 1 */
    for (int64_t e = 1; e <= 1 + span; e++) {
        const double sxx = PXX[e] - PXX[0], sx = PX[e] - PX[0], sw = PW[e] - PW[0];
        prev[e] = 0.0 + ((sxx - (2.0 * -1.0) * sx) + ((-1.0) * (-1.0)) * sw);
        start_of[1 * (m + 1) + e] = 1;
    }
    /* interior layers, one thread: each layer needs the whole previous one, and a barrier per
       layer costs far more than it saves when the machine is busy (measured: 1.2 s instead of
       0.11 s at load 16 on 2 cores) */
    for (int64_t cluster = 2; cluster < k; cluster++) {
        const int64_t last_end = cluster + span;
        double biggest = 0.0;
        for (int64_t i = cluster - 1; i < last_end; i++)
            if (fabs(prev[i]) > biggest) biggest = fabs(prev[i]);
        Layer L = {PW, PX, PXX, prev, next, start_of + cluster * (m + 1), 5.0 * (16.0 * U * (biggest + cost_scale))};
        solve_range(&L, cluster, last_end, cluster, last_end, scratch);
        double *swap = prev; prev = next; next = swap;
    }
    /* last layer: pinned to +1, only e = m, scanned in full */
    {
        double best = INFINITY;
        int64_t leftmost = -1;
        for (int64_t before = k - 1; before < m; before++) {
            const double sxx = PXX[m] - PXX[before], sx = PX[m] - PX[before], sw = PW[m] - PW[before];
            const double c = prev[before] + ((sxx - (2.0 * 1.0) * sx) + (1.0 * 1.0) * sw);
            if (c < best) { best = c; leftmost = before + 1; }
        }
        if (leftmost < 0) { status = DP_PREMISE; goto done; }
        start_of[k * (m + 1) + m] = (int16_t)leftmost;
    }
    /* backtrack, then sort */
    {
        int64_t end = m;
        for (int64_t cluster = k; cluster >= 1; cluster--) {
            const int64_t start = start_of[cluster * (m + 1) + end];
            if (cluster == 1) out[0] = -1.0f;
            else if (cluster == k) out[k - 1] = 1.0f;
            else out[cluster - 1] = (float)((PX[end] - PX[start - 1]) / (PW[end] - PW[start - 1]));
            end = start - 1;
        }
        /* insertion sort: already nearly sorted (runs are ascending) */
        for (int64_t i = 1; i < k; i++) {
            float v = out[i];
            int64_t j = i - 1;
            while (j >= 0 && out[j] > v) { out[j + 1] = out[j]; j--; }
            out[j + 1] = v;
        }
    }
done:
    free(PW); free(PX); free(PXX); free(prev); free(next); free(scratch); free(start_of);
    return status;
}
