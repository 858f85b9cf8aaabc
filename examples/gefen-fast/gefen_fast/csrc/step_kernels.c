/*
 * The steady step: the block-vmean step (SPEC 1.8) and the factored step (SPEC 1.9) of all
 * parameters of one optimizer step, in place, in one call (gefen_step_batch, at the end).
 *
 * A block (period P consecutive elements) needs its new magnitude (a maximum over the whole
 * block) before any element can be requantised, so each block is visited twice:
 *   pass A: read g and the old indices; decode, lerp (SPEC 1.8.8 steps 1-2), keep the lerped
 *           momentum in a per-thread scratch, the absolute maximum (step 3) and, in block mode,
 *           the sum of squares (SPEC 1.8.3), then the stepsize (SPEC 1.8.7);
 *   pass B: normalise, nearest codeword by the cell table (steps 4-5), store the index, decode,
 *           update the parameter (steps 6-7, SPEC 1.8.6 weight decay first).
 * Blocks up to KEEP_MAX elements are handed to the threads whole, and the second visit reads the
 * kept momentum from the cache: memory is read once (p, g, indices) and written once (p, indices).
 * Larger blocks are cut into pieces (a maximum and a sum over the pieces between the passes); pass
 * A keeps the lerps of a block's last pieces, up to LARGE_KEEP elements, in a scratch buffer, and
 * pass B takes those pieces first and recomputes the lerp of the others from g and the old index.
 *
 * Arithmetic is fp32, one rounding per operation; the lerp is a true fused multiply-add (fmaf /
 * vfmadd). Differences from the reference, all inside the tolerance profile (SPEC 5.6.1): the
 * association of fp32 sums (block sums, row and column sums), the IEEE square root (SPEC 1.13.1),
 * the factored stepsize's reciprocal (hardware estimate and a Newton step, within 2 ulp) and the
 * order of the update's products: q * r32(r32(mag * ss) * lr) (block), r32(q * r32(1/den)) *
 * r32(r32(mag * lr) * inv_bias1) (factored). The momentum (indices, magnitudes) depends on none of
 * them and equals the reference's bit for bit.
 *
 * Vector loops: sixteen lanes where the CPU has AVX-512 (the old indices decoded 64 at a time by
 * register permutes, wdecode64), then eight lanes (AVX2) for the rest of a range or on CPUs without AVX-512, then a
 * scalar tail; the same operations in each, so the momentum is the same from every width (the
 * tests build -DGEFEN_NO_AVX512 to check the 8-lane loops where both exist). The width changes
 * only the association of the block sums. Each vector loop prefetches its streams GEFEN_PREFETCH
 * elements ahead.
 *
 * Storage types: fp32, bf16 and fp16 (uint16 bit patterns); the parameter and gradient share it.
 * All pointers of one item refer to distinct, non-overlapping buffers (Python checks).
 */
#include "gefen_common.h"

/* Blocks up to this size keep their lerped momentum in a per-thread scratch between the passes. */
#define KEEP_MAX 65536
/* Pass B's stage: normalised values and cell offsets of this many elements at a time. */
#define B_STAGE 128
/* The vector loops prefetch the streams they read this many elements ahead (0: none). Passes A
   and B alternate block by block, so each stream is read in bursts of one block, and the
   hardware prefetchers, which stop at page boundaries, leave most of the bursts' starts to wait
   on memory: 512, 1024 or 2048 elements ahead took the kernel call of the 4.2M-parameter fp32
   step from 1.8-2.3 ms to 1.2-1.3 ms (AMD EPYC, 2 threads, benchmarks/kernel_ab.py, one run each). */
#ifndef GEFEN_PREFETCH
#define GEFEN_PREFETCH 1024
#endif
/* Prefetch the line of x[j + GEFEN_PREFETCH] (a macro: the vector loops' element types differ). */
#define PREFETCH_AHEAD(x, j) \
    do { if (GEFEN_PREFETCH) _mm_prefetch((const char *)((x) + (j) + GEFEN_PREFETCH), _MM_HINT_T0); } while (0)

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

/* decode[k[0..7]]: eight scalar loads (faster than a hardware gather on the CPUs measured), six
   of them folded into vpinsrd (one instruction each instead of a load and an insert) */
typedef int32_t gefen_f32_bits __attribute__((may_alias)); /* a float's bits, read in place */
static inline __m256 vdecode(const float *decode, const uint8_t *k) {
    const gefen_f32_bits *d = (const gefen_f32_bits *)decode;
    __m128i a = _mm_cvtsi32_si128(d[k[0]]);
    a = _mm_insert_epi32(a, d[k[1]], 1);
    a = _mm_insert_epi32(a, d[k[2]], 2);
    a = _mm_insert_epi32(a, d[k[3]], 3);
    __m128i b = _mm_cvtsi32_si128(d[k[4]]);
    b = _mm_insert_epi32(b, d[k[5]], 1);
    b = _mm_insert_epi32(b, d[k[6]], 2);
    b = _mm_insert_epi32(b, d[k[7]], 3);
    return _mm256_castsi256_ps(_mm256_set_m128i(b, a));
}

static inline __m256 vload_cell_pair(const char *first, const char *second) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)first)),
                                _mm_loadu_ps((const float *)second), 1);
}

/* Byte offsets of the cells of eight normalised values (see codeword_table.py): u in [-1, 1]
   gives cells 0..8192; NaN converts to 0x80000000, which the unsigned minimum sends to the NaN cell. */
static inline __m256i vcell_offsets(__m256 u) {
    __m256 x = _mm256_mul_ps(_mm256_add_ps(u, _mm256_set1_ps(1.0f)), _mm256_set1_ps(GEFEN_CELL_SCALE));
    __m256i cell = _mm256_min_epu32(_mm256_cvttps_epi32(x), _mm256_set1_epi32(GEFEN_NAN_CELL));
    return _mm256_slli_epi32(cell, 4);
}

/* The nearest codeword of eight normalised values u, whose cells are at byte offsets `off`
   (SPEC 1.7 by the cell table): returns the decoded codewords, *codes gets each code in its lane's
   low byte. The eight 16-byte cells are loaded whole and transposed into t, lo_val, hi_val, codes. */
static inline __m256 vlookup(__m256 u, const char *cells, const uint32_t *off, __m256i *codes) {
    __m256 r0 = vload_cell_pair(cells + off[0], cells + off[4]);
    __m256 r1 = vload_cell_pair(cells + off[1], cells + off[5]);
    __m256 r2 = vload_cell_pair(cells + off[2], cells + off[6]);
    __m256 r3 = vload_cell_pair(cells + off[3], cells + off[7]);
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

static inline __m256 vnearest(__m256 u, const Cell *cells, __m256i *codes) {
    uint32_t off[8] __attribute__((aligned(32)));
    _mm256_store_si256((__m256i *)off, vcell_offsets(u));
    return vlookup(u, (const char *)cells, off, codes);
}

/* the low byte of each lane, stored as eight bytes */
static inline void vstore_codes(uint8_t *dst, __m256i k) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i s = _mm256_shuffle_epi8(k, pick);
    _mm_storel_epi64((__m128i *)dst, _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
}

/* 1/x within 2 ulp: the hardware estimate and one Newton step (the factored stepsize, SPEC 5.6.5
   allows its rounding; a division per element would double the divider's load). */
static inline __m256 vreciprocal(__m256 x) {
    __m256 r = _mm256_rcp_ps(x);
    __m256 e = _mm256_fnmadd_ps(x, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(r, e, r);
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

/* ---------------------------------------------------- 16-lane element operations (AVX-512) */
#if GEFEN_AVX512

static inline __m512 wload_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline void wstore_f32(float *p, __m512 x) { _mm512_storeu_ps(p, x); }
static inline __m512 wround_f32(__m512 x) { return x; }
static inline __m512 wsquare_f32(__m512 x) { return _mm512_mul_ps(x, x); }

static inline __m512 wload_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
/* f32_bf16, lane-wise: the rounded bf16 bit pattern in the low half of each lane */
static inline __m512i wbf16_bits(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, quiet);
}
/* f32_bf16 of sixteen lanes, packed. Where the CPU has AVX512_BF16, vcvtneps2bf16: the same
   rounding to nearest even and the same quiet NaN, but it reads an fp32 subnormal as zero, so a
   vector holding one (vfpclassps) takes the integer rounding instead. */
static inline __m256i wbf16_pack(__m512 x) {
#if defined(__AVX512BF16__)
    if (__builtin_expect(_mm512_fpclass_ps_mask(x, 0x20) == 0, 1)) return (__m256i)_mm512_cvtneps_pbh(x);
#endif
    return _mm512_cvtepi32_epi16(wbf16_bits(x));
}
static inline void wstore_bf16(uint16_t *p, __m512 x) { _mm256_storeu_si256((__m256i *)p, wbf16_pack(x)); }
static inline __m512 wround_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(wbf16_pack(x)), 16));
}
static inline __m512 wsquare_bf16(__m512 x) { return wround_bf16(_mm512_mul_ps(x, x)); }

static inline __m512 wload_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline void wstore_f16(uint16_t *p, __m512 x) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
static inline __m512 wround_f16(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }
static inline __m512 wsquare_f16(__m512 x) { return _mm512_mul_ps(x, x); }

/* decode[k] of 64 codes at once, out[v] = decode[k[16v .. 16v + 15]].
   With AVX512_VBMI, from the byte planes (Table.planes): register 4b + c holds byte b of
   decode[64c .. 64c + 63], so each plane is two two-register byte permutes (vpermt2b, codes below
   and above 128) and a blend on bit 7; the four planes are then interleaved back into floats.
   The unpacks interleave within 128-bit lanes, so the codes' 4-byte groups are first transposed
   (one vpermd) for the four results to come out in order. 23 operations per 64 codes.
   Without it (AVX-512 CPUs before Ice Lake), the 256 codewords in 16 registers and two-register
   float permutes, one per run of 32 codes, bits 5-7 of k choosing among the eight: 19
   operations per 16 codes. Both were measured against scalar loads and hardware gathers on the
   AMD EPYC of benchmarks/, and both are faster than those. */
#if GEFEN_BYTE_DECODE
typedef struct { __m512i r[16]; } DecodeTable;
static inline void wdecode_load(const Table *tab, DecodeTable *t) {
    for (int s = 0; s < 16; s++) t->r[s] = _mm512_loadu_si512((const void *)(tab->planes + 64 * s));
}
static inline void wdecode64(const DecodeTable *t, __m512i codes, __m512 out[4]) {
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512i k = _mm512_permutexvar_epi32(order, codes);
    const __mmask64 high = _mm512_movepi8_mask(k);
    __m512i b[4];
    for (int p = 0; p < 4; p++)
        b[p] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(t->r[4 * p], k, t->r[4 * p + 1]),
                                      _mm512_permutex2var_epi8(t->r[4 * p + 2], k, t->r[4 * p + 3]));
    const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23));
    out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(hi01, hi23));
    out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(hi01, hi23));
}
#else
typedef struct { __m512 r[16]; } DecodeTable;
static inline void wdecode_load(const Table *tab, DecodeTable *t) {
    for (int s = 0; s < 16; s++) t->r[s] = _mm512_loadu_ps(tab->decode + 16 * s);
}
static inline __m512 wdecode16(const DecodeTable *t, __m512i k) {
    const __mmask16 b5 = _mm512_test_epi32_mask(k, _mm512_set1_epi32(32));
    const __mmask16 b6 = _mm512_test_epi32_mask(k, _mm512_set1_epi32(64));
    const __mmask16 b7 = _mm512_test_epi32_mask(k, _mm512_set1_epi32(128));
    __m512 x0 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t->r[0], k, t->r[1]), _mm512_permutex2var_ps(t->r[2], k, t->r[3]));
    __m512 x1 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t->r[4], k, t->r[5]), _mm512_permutex2var_ps(t->r[6], k, t->r[7]));
    __m512 x2 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t->r[8], k, t->r[9]), _mm512_permutex2var_ps(t->r[10], k, t->r[11]));
    __m512 x3 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t->r[12], k, t->r[13]), _mm512_permutex2var_ps(t->r[14], k, t->r[15]));
    return _mm512_mask_blend_ps(b7, _mm512_mask_blend_ps(b6, x0, x1), _mm512_mask_blend_ps(b6, x2, x3));
}
static inline void wdecode64(const DecodeTable *t, __m512i codes, __m512 out[4]) {
    out[0] = wdecode16(t, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 0)));
    out[1] = wdecode16(t, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 1)));
    out[2] = wdecode16(t, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 2)));
    out[3] = wdecode16(t, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, 3)));
}
#endif
/* The codes of [j, j + n), n a multiple of 16 up to 64, as 64 bytes (the rest zero). */
static inline __m512i wcodes64(const uint8_t *idx, int64_t n) {
    const __mmask64 m = n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
    return _mm512_maskz_loadu_epi8(m, (const void *)idx);
}

/* vcell_offsets on sixteen values */
static inline __m512i wcell_offsets(__m512 u) {
    __m512 x = _mm512_mul_ps(_mm512_add_ps(u, _mm512_set1_ps(1.0f)), _mm512_set1_ps(GEFEN_CELL_SCALE));
    __m512i cell = _mm512_min_epu32(_mm512_cvttps_epi32(x), _mm512_set1_epi32(GEFEN_NAN_CELL));
    return _mm512_slli_epi32(cell, 4);
}

/* vlookup on sixteen lanes: the sixteen 16-byte cells loaded into four registers (register i holds
   the cells of lanes i, i+4, i+8, i+12, one per 128-bit lane) and transposed within each 128-bit
   lane, which leaves every field in lane order; *codes gets each code in its lane's low byte. */
static inline __m512 wlookup(__m512 u, const char *cells, const uint32_t *off, __m512i *codes) {
#define GEFEN_CELLS4(i) \
    _mm512_insertf32x4(_mm512_insertf32x4(_mm512_insertf32x4(_mm512_castps128_ps512( \
        _mm_load_ps((const float *)(cells + off[i]))), _mm_load_ps((const float *)(cells + off[i + 4])), 1), \
        _mm_load_ps((const float *)(cells + off[i + 8])), 2), _mm_load_ps((const float *)(cells + off[i + 12])), 3)
    const __m512 r0 = GEFEN_CELLS4(0), r1 = GEFEN_CELLS4(1), r2 = GEFEN_CELLS4(2), r3 = GEFEN_CELLS4(3);
#undef GEFEN_CELLS4
    const __m512d t01 = _mm512_castps_pd(_mm512_unpacklo_ps(r0, r1)), t23 = _mm512_castps_pd(_mm512_unpacklo_ps(r2, r3));
    const __m512d h01 = _mm512_castps_pd(_mm512_unpackhi_ps(r0, r1)), h23 = _mm512_castps_pd(_mm512_unpackhi_ps(r2, r3));
    const __m512 t = _mm512_castpd_ps(_mm512_unpacklo_pd(t01, t23));
    const __m512 lo_val = _mm512_castpd_ps(_mm512_unpackhi_pd(t01, t23));
    const __m512 hi_val = _mm512_castpd_ps(_mm512_unpacklo_pd(h01, h23));
    const __m512i code = _mm512_castpd_si512(_mm512_unpackhi_pd(h01, h23));
    const __mmask16 above = _mm512_cmp_ps_mask(u, t, _CMP_GT_OQ);
    *codes = _mm512_mask_add_epi32(code, above, code, _mm512_srli_epi32(code, 16));
    return _mm512_mask_blend_ps(above, lo_val, hi_val);
}

/* vreciprocal on sixteen lanes: the 14-bit estimate and one Newton step (within 2 ulp) */
static inline __m512 wreciprocal(__m512 x) {
    __m512 r = _mm512_rcp14_ps(x);
    __m512 e = _mm512_fnmadd_ps(x, r, _mm512_set1_ps(1.0f));
    return _mm512_fmadd_ps(r, e, r);
}
#endif /* GEFEN_AVX512 */

/* How pass B gets each element's stepsize: one per block, or factored (SPEC 1.9.3 steps 5-7). */
typedef struct {
    float block_scale;        /* block mode: r32(r32(mag * ss) * lr) */
    float factored_scale;     /* factored: r32(r32(mag * lr) * inv_bias1) */
    const float *row_root;    /* factored: sqrt(v_row / mu / bc2) per row, else NULL */
    const float *col_root;    /* factored: sqrt(v_col) per column */
    int64_t cols;
    float inv_bias1, eps;
} Stepsize;

/* One parameter's step, filled by Python (gefen_fast/kernels.py mirrors it with ctypes). */
typedef struct {
    void *p;               /* the parameter (contiguous, logical order), updated in place */
    const void *g;         /* its gradient */
    uint8_t *idx;          /* m_codebook [blocks * period] */
    float *magnitude;      /* m_magnitude [blocks] */
    float *vmean;          /* block mode: vmean [blocks]; NULL for factored */
    float *v_row, *v_col;  /* factored: [rows], [cols] */
    const Table *tab;
    int64_t blocks, period, rows, cols;
    Hyper h;               /* h.bias2: block r32(sqrt(bc2)), factored r32(bc2) */
    int32_t dtype;         /* 0 fp32, 1 bf16, 2 fp16 */
    int32_t factored;
} Work;

/* Optional stage clocks (built with -DGEFEN_PROFILE by benchmarks/step_profile.py). */
/* stage clocks: seconds summed over threads, except CALL (the wall time of gefen_step_batch) */
enum { STAGE_MOMENTS, STAGE_PASS_A, STAGE_PASS_B, STAGE_LARGE_A, STAGE_LARGE_B, STAGE_WAIT, STAGE_CALL, STAGE_COUNT };
#ifdef GEFEN_PROFILE
#include <time.h>
static inline double gefen_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define GEFEN_TICK(t0) double t0 = gefen_now()
#define GEFEN_TOCK(t0, acc) do { double t1_ = gefen_now(); (acc) += t1_ - (t0); (t0) = t1_; } while (0)
#else
#define GEFEN_TICK(t0) do { } while (0)
#define GEFEN_TOCK(t0, acc) do { (void)(acc); } while (0)
#endif

/*
 * DEFINE_KERNELS(S, T, VEC): the kernels for storage type T (suffix S); VEC is 1 where the
 * AVX2 loops exist for T. Each loop has a scalar tail with the same operations.
 */
#define DEFINE_KERNELS(S, T, VEC)                                                                 \
                                                                                                 \
/* Pass A over [j0, j1) of a block: returns max |upd| as bits; *sum += squares (SUM).           \
   KEEP: store the lerps into keep (indexed from j0). The flags are compile-time constants at  \
   every call, so each variant is its own loop. */                                              \
static inline __attribute__((always_inline))                                                     \
uint32_t pass_a_body_##S(const T *restrict g, const uint8_t *restrict idx, const Table *tab,    \
                         int64_t j0, int64_t j1, float old, float w, float *restrict keep, float *sum, \
                         const int SUM, const int KEEP, const int SMALL) {                       \
    const float *restrict decode = tab->decode;                                                  \
    uint32_t top = 0;                                                                            \
    float total = 0.0f;                                                                          \
    int64_t j = j0;                                                                              \
    if (VEC) {                                                                                   \
        GEFEN_PASS_A_VECTOR(S)                                                                   \
    }                                                                                            \
    for (; j < j1; j++) {                                                                        \
        float x = LOAD_##S(g[j]);                                                                \
        if (SUM) total += SQUARE_##S(x);                                                         \
        float upd = lerp32(decode[idx[j]] * old, x, w, SMALL);                                   \
        if (KEEP) keep[j - j0] = upd;                                                            \
        uint32_t bits = f32_bits(upd) & 0x7FFFFFFFu;                                             \
        top = bits > top ? bits : top;                                                           \
    }                                                                                            \
    if (SUM) *sum += total;                                                                      \
    return top;                                                                                  \
}                                                                                                \
                                                                                                 \
static uint32_t pass_a_##S(const T *restrict g, const uint8_t *restrict idx, const Table *tab,  \
                           int64_t j0, int64_t j1, float old, float w, int small,                \
                           float *restrict keep, float *sum) {                                   \
    if (sum) {                                                                                   \
        if (keep) return small ? pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 1, 1, 1) \
                               : pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 1, 1, 0); \
        return small ? pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 1, 0, 1)          \
                     : pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 1, 0, 0);         \
    }                                                                                            \
    if (keep) return small ? pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 0, 1, 1)    \
                           : pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 0, 1, 0);   \
    return small ? pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 0, 0, 1)              \
                 : pass_a_body_##S(g, idx, tab, j0, j1, old, w, keep, sum, 0, 0, 0);             \
}                                                                                                \
                                                                                                 \
/* Pass B over [j0, j1) of a block whose first element is element `base` of the parameter.  \
   KEPT: the lerps from pass A (indexed from j0), else recomputed from g and the old indices;  \
   FACTORED: a stepsize per element from the row and column roots; DECAY: weight decay first. \
   The vector loop needs the cell table and a positive magnitude; the scalar loop does all. */ \
static inline __attribute__((always_inline))                                                     \
void pass_b_body_##S(T *restrict p, const T *restrict g, uint8_t *restrict idx, const Table *tab, \
                     int64_t base, int64_t j0, int64_t j1, float old, float mag,                 \
                     const float *restrict kept, const Stepsize *st, const Hyper *h,             \
                     const int KEPT, const int FACTORED, const int DECAY, const int SMALL) {     \
    const float *restrict decode = tab->decode;                                                  \
    const int positive = mag > 0.0f;                                                             \
    const int vector = VEC && tab->use_cells && positive;                                        \
    int64_t j = j0;                                                                              \
    while (j < j1) {                                                                             \
        /* a segment of one row (factored) or the whole range (block) */                       \
        int64_t end = j1;                                                                        \
        const int64_t seg0 = j;                                                                  \
        float row_root = 0.0f;                                                                   \
        const float *restrict col_root = NULL; /* indexed by j - seg0 */                         \
        if (FACTORED) {                                                                          \
            int64_t e = base + j, r = e / st->cols, c = e - r * st->cols;                        \
            end = j + (st->cols - c) < j1 ? j + (st->cols - c) : j1;                             \
            row_root = st->row_root[r];                                                          \
            col_root = st->col_root + c;                                                         \
        }                                                                                        \
        if (vector) {                                                                            \
            GEFEN_PASS_B_VECTOR(S)                                                               \
        }                                                                                        \
        for (; j < end; j++) {                                                                   \
            float upd = KEPT ? kept[j - j0] : lerp32(decode[idx[j]] * old, LOAD_##S(g[j]), h->w, SMALL); \
            float ratio = upd / mag;                                                             \
            float q;                                                                             \
            idx[j] = nearest_code(positive ? ratio : 0.0f, tab, &q);                             \
            float delta = FACTORED                                                               \
                ? (q / (row_root * col_root[j - seg0] + st->eps)) * st->factored_scale               \
                : q * st->block_scale;                                                           \
            float pv = LOAD_##S(p[j]);                                                           \
            if (DECAY) pv = ROUND_##S(pv * h->decay);                                            \
            p[j] = STORE_##S(pv - delta);                                                        \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
static void pass_b_##S(T *restrict p, const T *restrict g, uint8_t *restrict idx, const Table *tab, \
                       int64_t base, int64_t j0, int64_t j1, float old, float mag,              \
                       const float *restrict kept, const Stepsize *st, const Hyper *h) {         \
    const int fac = st->row_root != NULL, decay = h->apply_decay != 0;                           \
    const int small = fabsf(h->w) < 0.5f;                                                        \
    if (kept) {                                                                                  \
        if (fac) {                                                                               \
            if (decay) pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 1, 1, 1, 0); \
            else pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 1, 1, 0, 0); \
        } else {                                                                                 \
            if (decay) pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 1, 0, 1, 0); \
            else pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 1, 0, 0, 0); \
        }                                                                                        \
    } else if (small) {                                                                          \
        if (fac) {                                                                               \
            if (decay) pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 1, 1, 1); \
            else pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 1, 0, 1); \
        } else {                                                                                 \
            if (decay) pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 0, 1, 1); \
            else pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 0, 0, 1); \
        }                                                                                        \
    } else {                                                                                     \
        if (fac) {                                                                               \
            if (decay) pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 1, 1, 0); \
            else pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 1, 0, 0); \
        } else {                                                                                 \
            if (decay) pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 0, 1, 0); \
            else pass_b_body_##S(p, g, idx, tab, base, j0, j1, old, mag, kept, st, h, 0, 0, 0, 0); \
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
/* One whole block of at most KEEP_MAX elements: pass A into the thread's scratch, then pass B. */ \
static void small_block_##S(const Work *w, int64_t b, float *keep, const Stepsize *fac, double *clock) { \
    const int64_t period = w->period, base = b * period;                                         \
    const Hyper *h = &w->h;                                                                      \
    const T *g = (const T *)w->g + base;                                                         \
    uint8_t *idx = w->idx + base;                                                                \
    const float old = w->magnitude[b];                                                           \
    float sum = 0.0f;                                                                            \
    GEFEN_TICK(t0);                                                                              \
    uint32_t top = pass_a_##S(g, idx, w->tab, 0, period, old, h->w, fabsf(h->w) < 0.5f,  \
                              keep, w->vmean ? &sum : NULL);                                     \
    const float mag = bits_f32(top);                                                             \
    w->magnitude[b] = mag;                                                                       \
    Stepsize st;                                                                                 \
    if (fac) { st = *fac; st.factored_scale = (mag * h->lr) * h->inv_bias1; }                    \
    else {                                                                                       \
        memset(&st, 0, sizeof st);                                                               \
        st.block_scale = (mag * block_stepsize_##S(sum, period, w->vmean + b, h)) * h->lr;       \
    }                                                                                            \
    GEFEN_TOCK(t0, clock[STAGE_PASS_A]);                                                         \
    pass_b_##S((T *)w->p + base, g, idx, w->tab, base, 0, period, old, mag, keep, &st, h);       \
    GEFEN_TOCK(t0, clock[STAGE_PASS_B]);                                                         \
}                                                                                                \
                                                                                                 \
/* A slice [j0, j1) of a large block, pass A: the slice's maximum bits and sum of squares;     \
   keep: NULL, or where the slice's lerps go (indexed from j0) for pass B to read back. */     \
static uint32_t large_pass_a_##S(const Work *w, int64_t b, int64_t j0, int64_t j1, float *sum,  \
                                 float *keep) {                                                  \
    const int64_t base = b * w->period;                                                          \
    return pass_a_##S((const T *)w->g + base, w->idx + base, w->tab, j0, j1, w->magnitude[b], \
                      w->h.w, fabsf(w->h.w) < 0.5f, keep, w->vmean ? sum : NULL);                \
}                                                                                                \
                                                                                                 \
/* Pass B of a slice: kept is the slice's lerps from large_pass_a, or NULL to recompute them. */ \
static void large_pass_b_##S(const Work *w, int64_t b, int64_t j0, int64_t j1, float old, float mag, \
                             const float *kept, const Stepsize *st) {                            \
    const int64_t base = b * w->period;                                                          \
    pass_b_##S((T *)w->p + base, (const T *)w->g + base, w->idx + base, w->tab, base, j0, j1, old, mag, \
               kept, st, &w->h);                                                                 \
}                                                                                                \
                                                                                                 \
/* SPEC 1.9.3 step 3 for rows [r0, r1): row sums of squares, column sums into `part`. */        \
static void moment_rows_##S(const Work *w, int64_t r0, int64_t r1, float *restrict part,         \
                            float *restrict row_sums) {                                          \
    const int64_t cols = w->cols;                                                                \
    for (int64_t r = r0; r < r1; r++) {                                                          \
        const T *restrict gr = (const T *)w->g + r * cols;                                       \
        float sum = 0.0f;                                                                        \
        _Pragma("omp simd reduction(+:sum)")                                                     \
        for (int64_t c = 0; c < cols; c++) {                                                     \
            float x = LOAD_##S(gr[c]);                                                           \
            float sq = x * x;                                                                    \
            part[c] += sq;                                                                       \
            sum += sq;                                                                           \
        }                                                                                        \
        row_sums[r] = sum;                                                                       \
    }                                                                                            \
}

/* ------------------------------------------------------------------- vector loop bodies */
#if GEFEN_AVX512
/* Pass A on sixteen lanes (the same operations as the 8-lane loop below, which takes the rest),
   the old indices decoded 64 at a time (wdecode64); the byte planes are loaded into registers once
   per range, so only ranges of 64 or more take this loop. The sums are added sixteen lanes at a
   time in element order, as before the 64-wide decode. */
#define GEFEN_PASS_A_GROUP(S, jj, curv)                                                          \
    do {                                                                                         \
        PREFETCH_AHEAD(g, jj);                                                                   \
        __m512 x = wload_##S(g + (jj));                                                          \
        if (SUM) wsum = _mm512_add_ps(wsum, wsquare_##S(x));                                     \
        __m512 cur = _mm512_mul_ps(curv, wold);                                                  \
        __m512 d = _mm512_sub_ps(x, cur);                                                        \
        __m512 upd = SMALL ? _mm512_fmadd_ps(ww, d, cur) : _mm512_fmadd_ps(wnw, d, x);           \
        if (KEEP) _mm512_storeu_ps(keep + ((jj) - j0), upd);                                     \
        wtop = _mm512_max_epu32(wtop, _mm512_and_si512(_mm512_castps_si512(upd), wabs));         \
    } while (0)
#define GEFEN_PASS_A_WIDE(S)                                                                     \
    if (j1 - j >= 64) {                                                                          \
        DecodeTable table;                                                                       \
        wdecode_load(tab, &table);                                                               \
        const __m512 wold = _mm512_set1_ps(old), ww = _mm512_set1_ps(w);                         \
        const __m512 wnw = _mm512_set1_ps(-(1.0f - w));                                          \
        const __m512i wabs = _mm512_set1_epi32(0x7FFFFFFF);                                      \
        __m512i wtop = _mm512_setzero_si512();                                                   \
        __m512 wsum = _mm512_setzero_ps();                                                       \
        const int64_t wide_end = j + ((j1 - j) & ~(int64_t)15);                                  \
        __m512 dec[4];                                                                           \
        for (; j + 64 <= wide_end; j += 64) {                                                    \
            PREFETCH_AHEAD(idx, j);                                                              \
            wdecode64(&table, _mm512_loadu_si512((const void *)(idx + j)), dec);                 \
            GEFEN_PASS_A_GROUP(S, j, dec[0]);                                                    \
            GEFEN_PASS_A_GROUP(S, j + 16, dec[1]);                                               \
            GEFEN_PASS_A_GROUP(S, j + 32, dec[2]);                                               \
            GEFEN_PASS_A_GROUP(S, j + 48, dec[3]);                                               \
        }                                                                                        \
        if (j < wide_end) {                                                                      \
            wdecode64(&table, wcodes64(idx + j, wide_end - j), dec);                             \
            for (int q = 0; j < wide_end; j += 16, q++) GEFEN_PASS_A_GROUP(S, j, dec[q]);        \
        }                                                                                        \
        top = _mm512_reduce_max_epu32(wtop);                                                     \
        if (SUM) total = _mm512_reduce_add_ps(wsum);                                             \
    }

/* Pass B on sixteen lanes: the division, the cells, their lookups (wlookup) and the update sixteen
   at a time; the 8-lane loop below takes the rest. */
#define GEFEN_PASS_B_WIDE(S)                                                                     \
    if (end - j >= 64) {                                                                         \
        const __m512 wmag = _mm512_set1_ps(mag), wold = _mm512_set1_ps(old);                     \
        const __m512 ww = _mm512_set1_ps(h->w), wnw = _mm512_set1_ps(-(1.0f - h->w));            \
        const __m512 wdecay = _mm512_set1_ps(h->decay);                                          \
        const __m512 wblock = _mm512_set1_ps(st->block_scale);                                   \
        const __m512 wfscale = _mm512_set1_ps(st->factored_scale);                               \
        const __m512 wrow = _mm512_set1_ps(row_root), weps = _mm512_set1_ps(st->eps);            \
        const char *restrict cells = (const char *)tab->cells;                                   \
        DecodeTable table;                                                                       \
        if (!KEPT) wdecode_load(tab, &table);                                                    \
        uint32_t offsets[B_STAGE] __attribute__((aligned(64)));                                  \
        float normalised[B_STAGE] __attribute__((aligned(64)));                                  \
        const int64_t wide_end = j + ((end - j) & ~(int64_t)15);                                 \
        while (j < wide_end) {                                                                   \
            const int64_t m = wide_end - j < B_STAGE ? wide_end - j : B_STAGE;                   \
            for (int64_t i = 0; i < m; i += 64) {                                                \
                __m512 cur[4];                                                                   \
                if (!KEPT) {                                                                     \
                    PREFETCH_AHEAD(idx, j + i);                                                  \
                    wdecode64(&table, wcodes64(idx + j + i, m - i), cur);                        \
                }                                                                                \
                for (int64_t q = 0; q < 4 && i + 16 * q < m; q++) {                              \
                    const int64_t e = i + 16 * q;                                                \
                    __m512 upd;                                                                  \
                    if (KEPT) upd = _mm512_loadu_ps(kept + (j + e - j0));                        \
                    else {                                                                       \
                        PREFETCH_AHEAD(g, j + e);                                                \
                        __m512 x = wload_##S(g + j + e);                                         \
                        __m512 c = _mm512_mul_ps(cur[q], wold);                                  \
                        __m512 d = _mm512_sub_ps(x, c);                                          \
                        upd = SMALL ? _mm512_fmadd_ps(ww, d, c) : _mm512_fmadd_ps(wnw, d, x);    \
                    }                                                                            \
                    __m512 u = _mm512_div_ps(upd, wmag);                                         \
                    _mm512_store_ps(normalised + e, u);                                          \
                    _mm512_store_si512((__m512i *)(offsets + e), wcell_offsets(u));              \
                }                                                                                \
            }                                                                                    \
            for (int64_t i = 0; i < m; i += 16) {                                                \
                __m512i k;                                                                       \
                __m512 q = wlookup(_mm512_load_ps(normalised + i), cells, offsets + i, &k);      \
                _mm_storeu_si128((__m128i *)(idx + j + i), _mm512_cvtepi32_epi8(k));             \
                __m512 delta;                                                                    \
                if (FACTORED) {                                                                  \
                    __m512 den = _mm512_add_ps(_mm512_mul_ps(wrow, _mm512_loadu_ps(col_root + (j + i - seg0))), weps); \
                    delta = _mm512_mul_ps(_mm512_mul_ps(q, wreciprocal(den)), wfscale);          \
                } else {                                                                         \
                    delta = _mm512_mul_ps(q, wblock);                                            \
                }                                                                                \
                PREFETCH_AHEAD(p, j + i);                                                        \
                __m512 pv = wload_##S(p + j + i);                                                \
                if (DECAY) pv = wround_##S(_mm512_mul_ps(pv, wdecay));                           \
                wstore_##S(p + j + i, _mm512_sub_ps(pv, delta));                                 \
            }                                                                                    \
            j += m;                                                                              \
        }                                                                                        \
    }
#else
#define GEFEN_PASS_A_WIDE(S)
#define GEFEN_PASS_B_WIDE(S)
#endif

#if GEFEN_AVX2
#define GEFEN_PASS_A_VECTOR(S)                                                                   \
    GEFEN_PASS_A_WIDE(S)                                                                         \
    const __m256 vold = _mm256_set1_ps(old), vw = _mm256_set1_ps(w);                             \
    const __m256 vnw = _mm256_set1_ps(-(1.0f - w));                                              \
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);                                       \
    __m256i vtop = _mm256_setzero_si256();                                                       \
    __m256 vsum = _mm256_setzero_ps();                                                           \
    for (; j + 8 <= j1; j += 8) {                                                                \
        PREFETCH_AHEAD(g, j);                                                                    \
        PREFETCH_AHEAD(idx, j);                                                                  \
        __m256 x = vload_##S(g + j);                                                             \
        if (SUM) vsum = _mm256_add_ps(vsum, vsquare_##S(x));                                     \
        __m256 cur = _mm256_mul_ps(vdecode(decode, idx + j), vold);                              \
        __m256 d = _mm256_sub_ps(x, cur);                                                        \
        __m256 upd = SMALL ? _mm256_fmadd_ps(vw, d, cur) : _mm256_fmadd_ps(vnw, d, x);           \
        if (KEEP) _mm256_storeu_ps(keep + (j - j0), upd);                                        \
        vtop = _mm256_max_epu32(vtop, _mm256_and_si256(_mm256_castps_si256(upd), absmask));      \
    }                                                                                            \
    {                                                                                            \
        const uint32_t narrow_top = hmax_u32(vtop);                                              \
        top = narrow_top > top ? narrow_top : top;                                               \
    }                                                                                            \
    if (SUM) total += hsum_ps(vsum);

#define GEFEN_PASS_B_VECTOR(S)                                                                   \
    GEFEN_PASS_B_WIDE(S)                                                                         \
    {                                                                                            \
        const __m256 vmag = _mm256_set1_ps(mag), vold = _mm256_set1_ps(old);                     \
        const __m256 vw = _mm256_set1_ps(h->w), vnw = _mm256_set1_ps(-(1.0f - h->w));            \
        const __m256 vdecay = _mm256_set1_ps(h->decay);                                          \
        const __m256 vblock = _mm256_set1_ps(st->block_scale);                                   \
        const __m256 vfscale = _mm256_set1_ps(st->factored_scale);                               \
        const __m256 vrow = _mm256_set1_ps(row_root), veps = _mm256_set1_ps(st->eps);            \
        const char *restrict cells = (const char *)tab->cells;                                   \
        /* staged: first the normalised values and their cells (a long dependency chain through \
           the division), then the lookups and the update (a short one), so the loads of one    \
           stage overlap instead of waiting behind the division */                             \
        uint32_t offsets[B_STAGE] __attribute__((aligned(32)));                                  \
        float normalised[B_STAGE] __attribute__((aligned(32)));                                  \
        const int64_t vector_end = j + ((end - j) & ~(int64_t)7);                                \
        while (j < vector_end) {                                                                 \
            const int64_t m = vector_end - j < B_STAGE ? vector_end - j : B_STAGE;               \
            for (int64_t i = 0; i < m; i += 8) {                                                 \
                __m256 upd;                                                                      \
                if (KEPT) upd = _mm256_loadu_ps(kept + (j + i - j0));                            \
                else {                                                                           \
                    PREFETCH_AHEAD(g, j + i);                                                    \
                    PREFETCH_AHEAD(idx, j + i);                                                  \
                    __m256 x = vload_##S(g + j + i);                                             \
                    __m256 cur = _mm256_mul_ps(vdecode(decode, idx + j + i), vold);              \
                    __m256 d = _mm256_sub_ps(x, cur);                                            \
                    upd = SMALL ? _mm256_fmadd_ps(vw, d, cur) : _mm256_fmadd_ps(vnw, d, x);      \
                }                                                                                \
                __m256 u = _mm256_div_ps(upd, vmag);                                             \
                _mm256_store_ps(normalised + i, u);                                              \
                _mm256_store_si256((__m256i *)(offsets + i), vcell_offsets(u));                  \
            }                                                                                    \
            for (int64_t i = 0; i < m; i += 8) {                                                 \
                __m256i k;                                                                       \
                __m256 q = vlookup(_mm256_load_ps(normalised + i), cells, offsets + i, &k);      \
                vstore_codes(idx + j + i, k);                                                    \
                __m256 delta;                                                                    \
                if (FACTORED) {                                                                  \
                    __m256 den = _mm256_add_ps(_mm256_mul_ps(vrow, _mm256_loadu_ps(col_root + (j + i - seg0))), veps); \
                    delta = _mm256_mul_ps(_mm256_mul_ps(q, vreciprocal(den)), vfscale);          \
                } else {                                                                         \
                    delta = _mm256_mul_ps(q, vblock);                                            \
                }                                                                                \
                PREFETCH_AHEAD(p, j + i);                                                        \
                __m256 pv = vload_##S(p + j + i);                                                \
                if (DECAY) pv = vround_##S(_mm256_mul_ps(pv, vdecay));                           \
                vstore_##S(p + j + i, _mm256_sub_ps(pv, delta));                                 \
            }                                                                                    \
            j += m;                                                                              \
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

/* ------------------------------------------------------------------------- the driver */

#if GEFEN_HALF
#define GEFEN_DTYPES 3
#define DISPATCH(dtype, FN, ...) \
    ((dtype) == 0 ? FN##_f32(__VA_ARGS__) : (dtype) == 1 ? FN##_bf16(__VA_ARGS__) : FN##_f16(__VA_ARGS__))
#define DISPATCH_VOID(dtype, FN, ...) \
    do { if ((dtype) == 0) FN##_f32(__VA_ARGS__); else if ((dtype) == 1) FN##_bf16(__VA_ARGS__); else FN##_f16(__VA_ARGS__); } while (0)
#else
#define GEFEN_DTYPES 2
#define DISPATCH(dtype, FN, ...) ((dtype) == 0 ? FN##_f32(__VA_ARGS__) : FN##_bf16(__VA_ARGS__))
#define DISPATCH_VOID(dtype, FN, ...) \
    do { if ((dtype) == 0) FN##_f32(__VA_ARGS__); else FN##_bf16(__VA_ARGS__); } while (0)
#endif

#define MAX_THREADS 256

/* Wait until *done >= target (another thread's pass B of the kept pieces). */
static void kept_wait(const int64_t *done, int64_t target) {
    for (int spins = 0; __atomic_load_n(done, __ATOMIC_ACQUIRE) < target; spins++) gefen_relax(spins, 4096);
}

static double profile_clock[STAGE_COUNT];
static int64_t last_scratch_bytes;

/* The heap memory the last gefen_step_batch call allocated (all of it freed before returning). */
int64_t gefen_last_scratch_bytes(void) { return last_scratch_bytes; }

/* The first block of `w` whose first element is at or after `offset` (elements from its start). */
static inline int64_t first_block_at(const Work *w, int64_t offset) {
    return offset <= 0 ? 0 : (offset + w->period - 1) / w->period;
}

/* Work is handed out in fixed pieces, taken by whichever thread is free (a thread descheduled on
   a busy machine then delays one piece, not half the step), and every partial sum is taken per
   piece and added in piece order: the results do not depend on the thread count or the schedule. */
#define SMALL_CHUNK ((int64_t)1 << 16)   /* elements of small blocks per piece */
#define LARGE_PIECES 16                  /* pieces of one large block */
#define MOMENT_PIECES 8                  /* row pieces of one factored parameter */
/* Elements of a large block whose lerps pass A keeps for pass B (its last pieces, those most
   likely still in the cache when pass B starts with them); the rest of the block is recomputed
   from g and the old indices. One buffer for all large blocks: before a pass A piece writes it,
   its thread waits until every kept piece of the previous large blocks has been through pass B
   (a counter; pass B takes the kept pieces first and pass A writes them last, so the wait is
   rarely more than one load). */
#ifndef LARGE_KEEP
#define LARGE_KEEP ((int64_t)1 << 20)
#endif

/* The first piece of a large block of `period` elements whose lerps are kept: the pieces from
   it on hold at most LARGE_KEEP elements (LARGE_PIECES when none fits). */
static inline int first_kept_piece(int64_t period) {
    int k = 0;
    while (k < LARGE_PIECES && period - period * k / LARGE_PIECES > LARGE_KEEP) k++;
    return k;
}

/*
 * gefen_step_batch: one optimizer step for `count` parameters (SPEC 1.8 / 1.9 each), in one
 * parallel region of `threads` threads:
 *   1. the factored second moments (SPEC 1.9.3 steps 3-5) of all factored parameters: row pieces
 *      (row sums, column sums per piece), one barrier, then the columns and each parameter's rows;
 *   2. every block of at most KEEP_MAX elements, of all parameters, in pieces of about
 *      SMALL_CHUNK elements (whole blocks);
 *   3. larger blocks one at a time, pass A and pass B each in LARGE_PIECES pieces.
 * Returns 0; -1 when scratch memory could not be allocated, -2 for an unknown dtype, -3 for a
 * malformed item. In both error cases nothing was changed.
 */
int gefen_step_batch(const Work *items, int32_t count, int32_t threads) {
    GEFEN_TICK(call_start);
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    int64_t keep_max = 0, cols_total = 0, roots_total = 0, row_sums_total = 0, small_total = 0;
    int64_t total_elements = 0, moment_jobs = 0, large_keep = 0;
    for (int32_t i = 0; i < count; i++) {
        const Work *w = items + i;
        if (w->dtype < 0 || w->dtype >= GEFEN_DTYPES) return -2;
        if (w->period < 1 || w->blocks < 0) return -3;
        if (w->factored && (w->rows < 1 || w->cols < 1 || w->rows * w->cols != w->blocks * w->period)) return -3;
        if (!w->factored && !w->vmean) return -3;
        total_elements += w->blocks * w->period;
        if (w->period <= KEEP_MAX) {
            keep_max = w->period > keep_max ? w->period : keep_max;
            small_total += w->blocks * w->period;
        } else if (w->blocks > 0) {
            const int first = first_kept_piece(w->period);
            const int64_t kept = w->period - w->period * first / LARGE_PIECES;
            large_keep = kept > large_keep ? kept : large_keep;
        }
        if (w->factored) {
            cols_total += w->cols;
            roots_total += w->rows + w->cols;
            row_sums_total += w->rows;
            moment_jobs += MOMENT_PIECES;
        }
    }
    threads = gefen_threads_for(total_elements, threads);
    const size_t stride = ((size_t)keep_max + 15) & ~(size_t)15;
    const int64_t chunks = (small_total + SMALL_CHUNK - 1) / SMALL_CHUNK;
    const size_t large_stride = ((size_t)large_keep + 15) & ~(size_t)15;
    float *keep = (float *)aligned_alloc(64, ((size_t)threads * stride + large_stride) * sizeof(float) + 64);
    float *large_kept = keep + (size_t)threads * stride;
    float *parts = (float *)malloc(((size_t)MOMENT_PIECES * (size_t)cols_total + 1) * sizeof(float));
    float *roots = (float *)malloc(((size_t)roots_total + 1) * sizeof(float));
    float *row_sums = (float *)malloc(((size_t)row_sums_total + 1) * sizeof(float));
    Stepsize *fac = (Stepsize *)calloc((size_t)count + 1, sizeof(Stepsize));
    int64_t *starts = (int64_t *)malloc(((size_t)count + 1) * sizeof(int64_t));
    int64_t *part_at = (int64_t *)malloc(((size_t)count + 1) * sizeof(int64_t));
    int32_t *moment_item = (int32_t *)malloc(((size_t)moment_jobs + 1) * sizeof(int32_t));
    last_scratch_bytes = (int64_t)(((size_t)threads * stride + large_stride) * sizeof(float) + 64
        + ((size_t)MOMENT_PIECES * (size_t)cols_total + 1) * sizeof(float) + ((size_t)roots_total + 1) * sizeof(float)
        + ((size_t)row_sums_total + 1) * sizeof(float) + ((size_t)count + 1) * (sizeof(Stepsize) + 2 * sizeof(int64_t))
        + ((size_t)moment_jobs + 1) * sizeof(int32_t));
    if (!keep || !parts || !roots || !row_sums || !fac || !starts || !part_at || !moment_item) {
        free(keep); free(parts); free(roots); free(row_sums); free(fac); free(starts); free(part_at); free(moment_item);
        return -1;
    }
    /* where each parameter's small blocks start in the concatenation; the factored layouts */
    int64_t offset = 0, root_at = 0, row_at = 0, col_at = 0, job = 0;
    for (int32_t i = 0; i < count; i++) {
        const Work *w = items + i;
        starts[i] = offset;
        part_at[i] = col_at * MOMENT_PIECES;
        if (w->period <= KEEP_MAX) offset += w->blocks * w->period;
        if (w->factored) {
            fac[i].row_root = roots + root_at;
            fac[i].col_root = roots + root_at + w->rows;
            fac[i].cols = w->cols;
            fac[i].eps = w->h.eps;
            fac[i].inv_bias1 = w->h.inv_bias1;
            fac[i].block_scale = (float)row_at; /* where its row sums go (read back below) */
            root_at += w->rows + w->cols;
            row_at += w->rows;
            col_at += w->cols;
            for (int k = 0; k < MOMENT_PIECES; k++) moment_item[job++] = i;
        }
    }
    starts[count] = offset;
    int64_t kept_done = 0; /* kept pieces through pass B so far (atomic) */
    uint32_t tops[2][LARGE_PIECES];
    float sums[2][LARGE_PIECES];
    double clocks[MAX_THREADS][STAGE_COUNT];
    memset(clocks, 0, sizeof clocks);

    _Pragma("omp parallel num_threads(threads)")
    {
        int t = 0, nt = 1;
        GEFEN_THREAD_IDS(t, nt);
        (void)nt;
        double *clock = clocks[t];
        (void)clock;
        /* 1. factored second moments */
        if (moment_jobs) {
            GEFEN_TICK(t0);
            _Pragma("omp for schedule(dynamic, 1)")
            for (int64_t j = 0; j < moment_jobs; j++) {
                const int32_t i = moment_item[j];
                const Work *w = items + i;
                const int64_t piece = j % MOMENT_PIECES;
                float *rs = row_sums + (int64_t)fac[i].block_scale;
                float *part = parts + (size_t)part_at[i] + (size_t)piece * (size_t)w->cols;
                memset(part, 0, (size_t)w->cols * sizeof(float));
                DISPATCH_VOID(w->dtype, moment_rows, w, w->rows * piece / MOMENT_PIECES,
                              w->rows * (piece + 1) / MOMENT_PIECES, part, rs);
            }
            GEFEN_TOCK(t0, clock[STAGE_MOMENTS]);
            for (int32_t i = 0; i < count; i++) {
                const Work *w = items + i;
                if (!w->factored) continue;
                const Hyper *h = &w->h;
                const int64_t rows = w->rows, cols = w->cols;
                const float *p0 = parts + (size_t)part_at[i];
                float *col_root = (float *)fac[i].col_root;
                _Pragma("omp for schedule(static) nowait")
                for (int64_t c = 0; c < cols; c++) {
                    float total = p0[c];
                    for (int k = 1; k < MOMENT_PIECES; k++) total += p0[(size_t)k * (size_t)cols + c];
                    float v = fmaf(h->one_minus_beta2, total / (float)rows, w->v_col[c] * h->beta2);
                    w->v_col[c] = v;
                    col_root[c] = sqrtf(v);
                }
            }
            _Pragma("omp for schedule(dynamic, 1) nowait")
            for (int32_t i = 0; i < count; i++) {
                const Work *w = items + i;
                if (!w->factored) continue;
                const Hyper *h = &w->h;
                const int64_t rows = w->rows, cols = w->cols;
                const float *rs = row_sums + (int64_t)fac[i].block_scale;
                float *row_root = (float *)fac[i].row_root;
                float total = 0.0f;
                for (int64_t r = 0; r < rows; r++) {
                    float v = fmaf(h->one_minus_beta2, rs[r] / (float)cols, w->v_row[r] * h->beta2);
                    w->v_row[r] = v;
                    total += v;
                }
                float mu = total / (float)rows;
                mu = mu > 1.17549435e-38f ? mu : 1.17549435e-38f;
                for (int64_t r = 0; r < rows; r++) row_root[r] = sqrtf((w->v_row[r] / mu) / h->bias2);
            }
            GEFEN_TOCK(t0, clock[STAGE_MOMENTS]);
            _Pragma("omp barrier")
            GEFEN_TOCK(t0, clock[STAGE_WAIT]);
        }
        /* 2. small blocks, in pieces of whole blocks */
        {
            float *mine = keep + (size_t)t * stride;
            _Pragma("omp for schedule(dynamic, 1) nowait")
            for (int64_t chunk = 0; chunk < chunks; chunk++) {
                const int64_t lo = chunk * SMALL_CHUNK, hi = lo + SMALL_CHUNK;
                int32_t i = 0;
                while (starts[i + 1] <= lo) i++;  /* the parameter holding element lo */
                for (; i < count && starts[i] < hi; i++) {
                    const Work *w = items + i;
                    if (w->period > KEEP_MAX) continue;
                    int64_t b0 = first_block_at(w, lo - starts[i]);
                    int64_t b1 = first_block_at(w, hi - starts[i]);
                    if (b1 > w->blocks) b1 = w->blocks;
                    const Stepsize *f = w->factored ? fac + i : NULL;
                    for (int64_t b = b0; b < b1; b++) DISPATCH_VOID(w->dtype, small_block, w, b, mine, f, clock);
                }
            }
        }
        /* 3. large blocks, each in pieces */
        int64_t large_seen = 0, kept_before = 0;
        for (int32_t i = 0; i < count; i++) {
            const Work *w = items + i;
            if (w->period <= KEEP_MAX) continue;
            for (int64_t b = 0; b < w->blocks; b++, large_seen++) {
                GEFEN_TICK(t0);
                const int parity = (int)(large_seen & 1);
                const float old = w->magnitude[b];
                float old_v = w->vmean ? w->vmean[b] : 0.0f;
                const int first_kept = first_kept_piece(w->period);
                const int64_t keep_from = w->period * first_kept / LARGE_PIECES;
                float *kept = large_kept;
                _Pragma("omp for schedule(dynamic, 1)")
                for (int k = 0; k < LARGE_PIECES; k++) {
                    float part = 0.0f;
                    const int64_t j0 = w->period * k / LARGE_PIECES;
                    if (k >= first_kept) kept_wait(&kept_done, kept_before);
                    tops[parity][k] = DISPATCH(w->dtype, large_pass_a, w, b, j0, w->period * (k + 1) / LARGE_PIECES,
                                               &part, k >= first_kept ? kept + (j0 - keep_from) : NULL);
                    sums[parity][k] = part;
                }
                GEFEN_TOCK(t0, clock[STAGE_LARGE_A]);
                uint32_t top = 0;
                float sum = 0.0f;
                for (int k = 0; k < LARGE_PIECES; k++) {
                    top = tops[parity][k] > top ? tops[parity][k] : top;
                    sum += sums[parity][k];
                }
                const float mag = bits_f32(top);
                Stepsize st;
                if (w->factored) { st = fac[i]; st.factored_scale = (mag * w->h.lr) * w->h.inv_bias1; }
                else {
                    memset(&st, 0, sizeof st);
                    float ss = w->dtype == 1 ? block_stepsize_bf16(sum, w->period, &old_v, &w->h)
                                             : block_stepsize_f32(sum, w->period, &old_v, &w->h);
                    st.block_scale = (mag * ss) * w->h.lr;
                }
                /* the kept pieces first (the last ones of pass A, likeliest in the cache) */
                _Pragma("omp for schedule(dynamic, 1) nowait")
                for (int r = 0; r < LARGE_PIECES; r++) {
                    const int k = LARGE_PIECES - 1 - r;
                    const int64_t j0 = w->period * k / LARGE_PIECES;
                    DISPATCH_VOID(w->dtype, large_pass_b, w, b, j0, w->period * (k + 1) / LARGE_PIECES, old, mag,
                                  k >= first_kept ? kept + (j0 - keep_from) : NULL, &st);
                    if (k >= first_kept) __atomic_fetch_add(&kept_done, 1, __ATOMIC_RELEASE);
                }
                kept_before += LARGE_PIECES - first_kept;
                _Pragma("omp single nowait")
                {
                    w->magnitude[b] = mag;
                    if (w->vmean) w->vmean[b] = old_v;
                }
                GEFEN_TOCK(t0, clock[STAGE_LARGE_B]);
            }
        }
    }
#ifdef GEFEN_PROFILE
    for (int k = 0; k < threads; k++)
        for (int s = 0; s < STAGE_COUNT; s++) profile_clock[s] += clocks[k][s];
    GEFEN_TOCK(call_start, profile_clock[STAGE_CALL]);
#endif
    free(keep); free(parts); free(roots); free(row_sums); free(fac); free(starts); free(part_at); free(moment_item);
    return 0;
}

/* Seconds spent per stage (summed over threads) since the last call, and reset. */
int gefen_profile_read(double *out, int32_t n) {
    for (int s = 0; s < STAGE_COUNT && s < n; s++) { out[s] = profile_clock[s]; profile_clock[s] = 0.0; }
#ifdef GEFEN_PROFILE
    return STAGE_COUNT;
#else
    return 0;
#endif
}

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

/* What this build offers: bit 0 AVX2 loops, bit 1 fp16 kernels, bit 2 AVX-512 loops, bit 3 their
   byte-permute decode. */
int gefen_capabilities(void) {
    return (GEFEN_AVX2 ? 1 : 0) | (GEFEN_HALF ? 2 : 0) | (GEFEN_AVX512 ? 4 : 0) | (GEFEN_BYTE_DECODE ? 8 : 0);
}
int gefen_abi_version(void) { return GEFEN_ABI_VERSION; }
