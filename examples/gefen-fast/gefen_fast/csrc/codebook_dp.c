/*
 * The optimal codebook of SPEC 1.6.8 (the DP case, K <= m active bins), bit for bit.
 *
 * Every float64 operation is the one SPEC 1.6.8 fixes (sequential prefix sums, the three cost
 * formulas evaluated left to right, strict-< scans so ties go to the smallest start), built with
 * -ffp-contract=off so nothing is fused. The interior layers use the same error-bounded monotone
 * divide and conquer as the reference's default solver (reference/gefen_reference/codebook_solver.py,
 * _interior_layer): for the middle end of a range every start in its window is scanned; the
 * windows of the ends on either side are cut at the starts whose candidate is within `tol` of the
 * minimum, with tol = 5 * 16u(max|prev| + cost scale). The reference proves that such a cut
 * never removes the leftmost minimiser, so the result is the full scan's. Where the proof's
 * premise (non-decreasing per-bin means with a margin) fails, or a count vanishes in the running
 * sum, this returns a status and Python runs the reference solver instead.
 *
 * Two threads: each interior layer is split where the search splits it first, at its middle
 * end, whose scan gives the windows of the two halves. The calling thread solves the middle end
 * and the left half; a helper thread, where one is given, solves the middle end too (the same
 * operations, so the same window) and the right half into its own slot, which the caller copies.
 * Each end's result is the full scan's whichever thread computes it.
 * The caller never waits on the helper for long: a right half the helper has not claimed, or has
 * not finished within twice the left half's time, the caller solves itself (the helper's late
 * result is dropped). The rows of the last ROWS_KEPT layers are kept in a ring, and the caller
 * waits only before overwriting the row a late helper still reads (a helper descheduled for
 * ROWS_KEPT - 1 layers): on a busy machine that is a rare wait, not one per layer.
 */
#include "gefen_common.h"
#include <time.h>

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
   work of the recursion. Four ends are scanned at once, one per lane, start by start (eight with
   AVX-512, scan_ends8: the divider takes eight lanes in the time of four, measured on the AMD
   EPYC of benchmarks/: the DP 0.71-0.81x on one thread, 0.80-0.81x on two). */
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

#if GEFEN_AVX512
/* scan_ends on eight lanes (ends e0..e1, at most 8): the same float64 operations per candidate,
   the first strict minimum kept; the divider takes eight lanes in the time of four. */
static void scan_ends8(const Layer *L, int64_t e0, int64_t e1, int64_t s_lo, int64_t s_hi) {
    const __mmask8 lanes = (__mmask8)((1u << (e1 - e0 + 1)) - 1u);
    const __m512d pw = _mm512_maskz_loadu_pd(lanes, L->PW + e0), px = _mm512_maskz_loadu_pd(lanes, L->PX + e0);
    const __m512d pxx = _mm512_maskz_loadu_pd(lanes, L->PXX + e0);
    const __m512d ends = _mm512_add_pd(_mm512_set1_pd((double)e0), _mm512_setr_pd(0, 1, 2, 3, 4, 5, 6, 7));
    __m512d best = _mm512_set1_pd(INFINITY), arg = _mm512_set1_pd(-1.0);
    const int64_t top = s_hi < e1 ? s_hi : e1;
    for (int64_t s = s_lo; s <= top; s++) {
        const int64_t b = s - 1;
        const __m512d sw = _mm512_sub_pd(pw, _mm512_set1_pd(L->PW[b]));
        const __m512d sx = _mm512_sub_pd(px, _mm512_set1_pd(L->PX[b]));
        const __m512d sxx = _mm512_sub_pd(pxx, _mm512_set1_pd(L->PXX[b]));
        const __m512d c = _mm512_add_pd(_mm512_set1_pd(L->prev[b]),
                                        _mm512_sub_pd(sxx, _mm512_div_pd(_mm512_mul_pd(sx, sx), sw)));
        const __m512d vs = _mm512_set1_pd((double)s);
        const __mmask8 valid = _mm512_mask_cmp_pd_mask(lanes, vs, ends, _CMP_LE_OQ);
        const __mmask8 lower = _mm512_mask_cmp_pd_mask(valid, c, best, _CMP_LT_OQ);
        best = _mm512_mask_blend_pd(lower, best, c);
        arg = _mm512_mask_blend_pd(lower, arg, vs);
    }
    double b8[8], a8[8];
    _mm512_storeu_pd(b8, best);
    _mm512_storeu_pd(a8, arg);
    for (int i = 0; i <= e1 - e0; i++) {
        L->dp[e0 + i] = b8[i];
        L->start_of[e0 + i] = (int16_t)a8[i];
    }
}
#endif

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
#if GEFEN_AVX512
            scan_ends8(L, e_lo, e_hi, s_lo, s_hi);
#else
            for (int64_t e = e_lo; e <= e_hi; e += 4)
                scan_ends(L, e, e + 3 <= e_hi ? e + 3 : e_hi, s_lo, s_hi);
#endif
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

/* Rows of dp values kept in the ring with a helper (a power of two); without one, two rows (the
   fewer rows, the more of them stay in the core's cache: 16 rows cost one thread 10% more). */
#ifndef ROWS_KEPT
#define ROWS_KEPT 4
#endif

/* The layers' shared state between the calling thread and the helper. */
typedef struct {
    const double *PW, *PX, *PXX;
    double *rows;          /* a ring of m + 1 doubles per row: layer c's dp in row c & mask */
    int64_t mask;          /* rows in the ring - 1 */
    int16_t *start_of;     /* (k + 1) rows of m + 1 */
    double *tols;          /* tol of layer c */
    int64_t m, span;
    int64_t *claim;        /* layer c's right half: 0 free, 1 the caller's, 2 the helper's (atomic) */
    int64_t *done;         /* layer c's right half is in the helper's slot c & 1 (atomic) */
    double *slot_dp[2];
    int16_t *slot_start[2];
    int64_t ready;         /* the newest layer whose previous row and tol are complete (atomic) */
    int64_t finished;      /* the caller is done: the helper returns (atomic) */
    int64_t working;       /* the layer whose right half the helper claims or solves, else 0 (atomic) */
} Layers;

static inline double *row_of(const Layers *S, int64_t c) { return S->rows + (c & S->mask) * (S->m + 1); }

static Layer layer_of(const Layers *S, int64_t c, double *dp, int16_t *start_of) {
    Layer L = {S->PW, S->PX, S->PXX, row_of(S, c - 1), dp, start_of, S->tols[c]};
    return L;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The helper: the right half of the newest ready layer it can claim, until the caller finishes. */
static void helper_loop(Layers *S, double *cand) {
    int64_t seen = 1;
    for (int spins = 0; !__atomic_load_n(&S->finished, __ATOMIC_ACQUIRE); spins++) {
        const int64_t c = __atomic_load_n(&S->ready, __ATOMIC_ACQUIRE);
        if (c <= seen) { gefen_relax(spins, 2048); continue; }
        seen = c;
        spins = 0;
        /* announced before the claim: a caller that sees the claim sees which row is read */
        __atomic_store_n(&S->working, c, __ATOMIC_SEQ_CST);
        int64_t expected = 0;
        if (!__atomic_compare_exchange_n(S->claim + c, &expected, 2, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&S->working, 0, __ATOMIC_SEQ_CST);
            continue;
        }
#ifdef GEFEN_DP_LATE_HELPER
        /* tests: a helper descheduled on every third layer it claims, GEFEN_DP_LATE_HELPER us, so
           the caller takes those layers over and waits before reusing the row the helper reads */
        if (c % 3 == 0) {
            struct timespec pause = {0, (long)GEFEN_DP_LATE_HELPER * 1000L};
            nanosleep(&pause, NULL);
        }
#endif
        const int64_t slot = c & 1, last_end = c + S->span;
        Layer L = layer_of(S, c, S->slot_dp[slot], S->slot_start[slot]);
        int64_t near_lo, near_hi;
        const int64_t mid = solve_mid(&L, c, last_end, c, last_end, cand, &near_lo, &near_hi);
        if (mid < last_end) solve_range(&L, mid + 1, last_end, near_lo, last_end, cand);
        __atomic_store_n(S->done + c, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&S->working, 0, __ATOMIC_SEQ_CST);
    }
}

/* The caller: every interior layer, the right halves the helper does not deliver in time included. */
static void caller_loop(Layers *S, int64_t k, double cost_scale, double *cand, int helped) {
    const int64_t m = S->m, span = S->span;
    for (int64_t c = 2; c < k; c++) {
        const int64_t last_end = c + span;
        const double *prev = row_of(S, c - 1);
        double biggest = 0.0;
        for (int64_t i = c - 1; i < last_end; i++)
            if (fabs(prev[i]) > biggest) biggest = fabs(prev[i]);
        S->tols[c] = 5.0 * (16.0 * U * (biggest + cost_scale));
        double *row = row_of(S, c);
        int16_t *starts = S->start_of + c * (m + 1);
        /* row c's place held layer c - rows: a helper still on layer c - rows + 1 reads it */
        for (int spins = 0;; spins++) {
            const int64_t late = __atomic_load_n(&S->working, __ATOMIC_SEQ_CST);
            if (late == 0 || late > c - S->mask) break;
            gefen_relax(spins, 2048);
        }
        __atomic_store_n(&S->ready, c, __ATOMIC_RELEASE);
        Layer L = layer_of(S, c, row, starts);
        const double t0 = helped ? seconds_now() : 0.0;
        /* solve_range's first step, split open: the middle end, the left half, then the right */
        int64_t near_lo, near_hi;
        const int64_t mid = solve_mid(&L, c, last_end, c, last_end, cand, &near_lo, &near_hi);
        if (c < mid) solve_range(&L, c, mid - 1, c, near_hi, cand);
        if (mid == last_end) continue;
        const int64_t split = mid + 1;
        int64_t expected = 0;
        if (__atomic_compare_exchange_n(S->claim + c, &expected, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            solve_range(&L, split, last_end, near_lo, last_end, cand);
            continue;
        }
        /* the helper has it: wait up to twice the left half's time, then solve it here */
        const double t1 = seconds_now(), patience = 2.0 * (t1 - t0) + 10e-6;
        int delivered = 0;
        for (int spins = 0;; spins++) {
            if (__atomic_load_n(S->done + c, __ATOMIC_ACQUIRE)) { delivered = 1; break; }
            if ((spins & 63) == 0 && seconds_now() - t1 > patience) break;
#if GEFEN_AVX2
            _mm_pause();
#endif
        }
        if (delivered) {
            const int64_t slot = c & 1;
            memcpy(row + split, S->slot_dp[slot] + split, (size_t)(last_end - split + 1) * sizeof(double));
            memcpy(starts + split, S->slot_start[slot] + split, (size_t)(last_end - split + 1) * sizeof(int16_t));
        } else {
            solve_range(&L, split, last_end, near_lo, last_end, cand);
        }
    }
    __atomic_store_n(&S->finished, 1, __ATOMIC_RELEASE);
}

/*
 * centers, weights: the m active bins (float64 of the fp32-rounded values, SPEC 1.6.6), m >= k.
 * Writes the k sorted fp32 codewords into out. threads: 2 or more lets a helper thread solve half
 * of every interior layer (the same codebook, bit for bit, from any number of threads).
 */
int gefen_codebook_dp(const double *centers, const double *weights, int64_t m, int64_t k, float *out,
                      int32_t threads) {
    if (k < 3 || m < k || m > 32000) return DP_BAD_INPUT;
    const int64_t span = m - k;
    const size_t width = (size_t)(m + 1);
    /* +4: scan_ends loads four ends at a time */
    double *PW = (double *)calloc((size_t)(m + 5), sizeof(double));
    double *PX = (double *)calloc((size_t)(m + 5), sizeof(double));
    double *PXX = (double *)calloc((size_t)(m + 5), sizeof(double));
    double *rows = (double *)malloc((size_t)ROWS_KEPT * width * sizeof(double));
    double *tols = (double *)calloc((size_t)(k + 1), sizeof(double));
    int64_t *flags = (int64_t *)calloc(2 * (size_t)(k + 1), sizeof(int64_t));
    double *scratch = (double *)malloc(4 * width * sizeof(double)); /* each thread's candidates, the helper's slots */
    int16_t *slot_starts = (int16_t *)malloc(2 * width * sizeof(int16_t));
    int16_t *start_of = (int16_t *)malloc((size_t)(k + 1) * width * sizeof(int16_t));
    int status = DP_OK;
    if (!PW || !PX || !PXX || !rows || !tols || !flags || !scratch || !slot_starts || !start_of) {
        status = DP_NO_MEMORY;
        goto done;
    }

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

    /* layer 1: pinned to -1, every end starts at 1 (each layer reads only its ends' range of the row before) */
    const int helper = threads >= 2 && k > 3 && span >= 64;
    Layers S = {PW, PX, PXX, rows, helper ? ROWS_KEPT - 1 : 1, start_of, tols, m, span, flags, flags + (k + 1),
                {scratch + 2 * width, scratch + 3 * width}, {slot_starts, slot_starts + width}, 1, 0, 0};
    double *first = row_of(&S, 1);
    for (int64_t e = 1; e <= 1 + span; e++) {
        const double sxx = PXX[e] - PXX[0], sx = PX[e] - PX[0], sw = PW[e] - PW[0];
        first[e] = 0.0 + ((sxx - (2.0 * -1.0) * sx) + ((-1.0) * (-1.0)) * sw);
        start_of[1 * width + e] = 1;
    }
    /* interior layers: the caller and, with threads >= 2 and enough work, a helper */
    if (helper) {
        _Pragma("omp parallel num_threads(2)")
        {
            int t = 0, nt = 1;
            GEFEN_THREAD_IDS(t, nt);
            if (t == 0) caller_loop(&S, k, cost_scale, scratch, nt > 1);
            else helper_loop(&S, scratch + width);
        }
    } else {
        caller_loop(&S, k, cost_scale, scratch, 0);
    }
    /* last layer: pinned to +1, only e = m, scanned in full */
    {
        const double *prev = row_of(&S, k - 1);
        double best = INFINITY;
        int64_t leftmost = -1;
        for (int64_t before = k - 1; before < m; before++) {
            const double sxx = PXX[m] - PXX[before], sx = PX[m] - PX[before], sw = PW[m] - PW[before];
            const double c = prev[before] + ((sxx - (2.0 * 1.0) * sx) + (1.0 * 1.0) * sw);
            if (c < best) { best = c; leftmost = before + 1; }
        }
        if (leftmost < 0) { status = DP_PREMISE; goto done; }
        start_of[k * width + m] = (int16_t)leftmost;
    }
    /* backtrack, then sort */
    {
        int64_t end = m;
        for (int64_t cluster = k; cluster >= 1; cluster--) {
            const int64_t start = start_of[cluster * (int64_t)width + end];
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
    free(PW); free(PX); free(PXX); free(rows); free(tols); free(flags); free(scratch); free(slot_starts); free(start_of);
    return status;
}
