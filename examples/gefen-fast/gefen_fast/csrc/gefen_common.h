/*
 * Shared definitions of the gefen-fast kernel library: the structures Python fills
 * (gefen_fast/native.py mirrors them with ctypes), the scalar conversions between fp32 and the
 * 16-bit storage types, and the scalar nearest-codeword lookup.
 *
 * Every kernel is built with -ffp-contract=off: no a*b+c is fused except the explicit fmaf of
 * the lerp (SPEC 1.13.3), so the rounding of each operation is the one the comments state.
 */
#ifndef GEFEN_COMMON_H
#define GEFEN_COMMON_H

#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GEFEN_AVX2 1
#else
#define GEFEN_AVX2 0
#endif

/* 16-lane loops where the CPU has AVX-512 (F, BW, DQ, VL); the 8-lane loops then take the rest.
   -DGEFEN_NO_AVX512 builds the 8-lane loops alone (the tests compare both builds). */
#if GEFEN_AVX2 && !defined(GEFEN_NO_AVX512) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define GEFEN_AVX512 1
#else
#define GEFEN_AVX512 0
#endif
/* The 16-lane loops decode old indices by byte permutes (vpermt2b) where the CPU has AVX512_VBMI. */
#if GEFEN_AVX512 && defined(__AVX512VBMI__)
#define GEFEN_BYTE_DECODE 1
#else
#define GEFEN_BYTE_DECODE 0
#endif

#if defined(__F16C__)
#include <immintrin.h>
#define GEFEN_HALF 1
#elif defined(__FLT16_MAX__)
#define GEFEN_HALF 2 /* the compiler's _Float16 */
#else
#define GEFEN_HALF 0 /* no fp16 kernels: Python stages fp16 through fp32 */
#endif

#ifdef _OPENMP
#include <omp.h>
#define GEFEN_THREAD_IDS(t, nt) do { t = omp_get_thread_num(); nt = omp_get_num_threads(); } while (0)
#else
#define GEFEN_THREAD_IDS(t, nt) do { t = 0; nt = 1; } while (0)
#endif

/* One turn of a wait on another thread: a pause while `spins` is below `pauses`, then the core is
   yielded, as a descheduled partner on a busy machine needs it back. */
static inline void gefen_relax(int spins, int pauses) {
    if (spins < pauses) {
#if GEFEN_AVX2
        _mm_pause();
#endif
    } else {
        sched_yield();
    }
}

/* Threads worth forking for `work` elements: at least GEFEN_MIN_PER_THREAD each (below that a
   fork and join costs more than it saves, and far more when the machine is oversubscribed). */
#define GEFEN_MIN_PER_THREAD 65536
static inline int gefen_threads_for(int64_t work, int threads) {
    int64_t useful = work / GEFEN_MIN_PER_THREAD;
    if (useful < 1) useful = 1;
    if (threads < 1) threads = 1;
    return useful < threads ? (int)useful : threads;
}

/* Bumped whenever a structure or a signature changes: Python refuses a library of another version. */
#define GEFEN_ABI_VERSION 5

/* The nearest-codeword table (gefen_fast/codeword_table.py). A normalised value u in [-1, 1] has
 * the cell int(r32(u + 1) * 4096) in [0, 8192]; NaN has cell 8193. Within a cell the rule of
 * SPEC 1.7 changes its answer at most once, at `t`: u <= t gives code `lo`, u > t gives `hi`. */
#define GEFEN_CELLS 8192
#define GEFEN_CELL_SCALE 4096.0f
#define GEFEN_NAN_CELL (GEFEN_CELLS + 1)

typedef struct {
    float t;       /* the change point inside the cell, +inf if none */
    float lo_val;  /* decode[lo]: the codeword rounded to the gradient dtype */
    float hi_val;  /* decode[hi] */
    int32_t codes; /* lo | (hi - lo) << 16 */
} Cell;

typedef struct {
    const Cell *cells;      /* [GEFEN_CELLS + 2], 16-byte aligned */
    const float *decode;    /* [256]: codewords rounded to the gradient dtype (SPEC 1.8.8 steps 1, 6) */
    const float *codebook;  /* [256]: the fp32 search codebook (SPEC 1.7) */
    const uint8_t *planes;  /* [4][256]: byte b (little-endian) of decode[k] at planes[256 b + k] */
    int32_t use_cells;      /* 0: the cells cannot represent this codebook, search instead */
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
} Hyper;

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* bf16 <-> fp32: widening is exact; narrowing rounds to nearest even, NaN stays NaN. */
static inline float bf16_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }
static inline uint16_t f32_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)(f != f ? quiet : rounded);
}
static inline float round_bf16(float f) { return bf16_f32(f32_bf16(f)); }

/* fp16 <-> fp32 (IEEE binary16), round to nearest even. */
#if GEFEN_HALF == 1
static inline float f16_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f32_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif GEFEN_HALF == 2
static inline float f16_f32(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t f32_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
#endif
#if GEFEN_HALF
static inline float round_f16(float f) { return f16_f32(f32_f16(f)); }
#endif

/* torch lerp(cur, target, w) on CPU (SPEC 1.8.8 step 2, SPEC 1.13.3); small_weight: |w| < 0.5 */
static inline float lerp32(float cur, float target, float w, int small_weight) {
    float d = target - cur;
    return small_weight ? fmaf(w, d, cur) : fmaf(-(1.0f - w), d, target);
}

static inline int32_t cell_of(float u) {
    if (u != u) return GEFEN_NAN_CELL;
    int32_t c = (int32_t)((u + 1.0f) * GEFEN_CELL_SCALE);
    return c < 0 ? 0 : (c > GEFEN_CELLS ? GEFEN_CELLS : c);
}

/* SPEC 1.7.1 literally: lower bound, then one comparison; ties to the lower index; NaN -> 255 */
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

/* The code of u and its decoded value, by the cells when they apply, else by search. */
static inline uint8_t nearest_code(float u, const Table *tab, float *decoded) {
    if (tab->use_cells) {
        const Cell *c = tab->cells + cell_of(u);
        int above = u > c->t;
        *decoded = above ? c->hi_val : c->lo_val;
        return (uint8_t)((c->codes & 0xFF) + (above ? (c->codes >> 16) : 0));
    }
    uint8_t k = nearest_by_search(u, tab->codebook);
    *decoded = tab->decode[k];
    return k;
}

#endif
