/*
 * vector_check: read one Gefen test vector (a safetensors file written by
 * `gefen-conformance vectors export`, SPEC 4.5.8), run the last stage of a block step as a
 * scalar loop, and check every element against the vector's per-element bound.
 *
 * The stage: given the second moment after the step (NAME.reference.vmean, one per block) and
 * the decoded new momentum (codebook[NAME.reference.m_codebook] * NAME.reference.m_magnitude),
 * apply weight decay and the update (SPEC 1.8.5-1.8.7):
 *
 *     stepsize = (1 / bc1) / (sqrt(vmean / bc2) + eps)
 *     p1       = p0 * (1 - lr * wd) - lr * stepsize * codeword * magnitude
 *
 * in fp32, rounded once to the parameter's dtype (F32, BF16 or F16), and require
 * |p1 - NAME.expected.param| <= NAME.allowed.param at every element. A CUDA or C++ kernel test
 * does the same with its kernel in place of the loop.
 *
 *     cc -std=c99 -O2 -o vector_check vector_check.c -lm
 *     ./vector_check VECTOR.safetensors NAME [NAME ...]
 *
 * Exit status: 0 every element of every NAME within its bound, 1 one is not, 2 the file or a
 * tensor cannot be read (or a usage error). C99 and the C library only; little-endian hosts.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIRST 10

typedef struct {
    unsigned char *bytes; /* the whole file */
    size_t size;
    const char *header; /* NUL-terminated copy of the JSON header */
    size_t data;        /* where the tensor data starts */
} File;

typedef struct {
    char dtype[8];
    size_t shape[8];
    int rank;
    size_t count;
    const unsigned char *data; /* little-endian, row-major */
} Tensor;

static int fail_read(const char *what, const char *detail) {
    fprintf(stderr, "vector_check: %s: %s\n", what, detail);
    return 0;
}

static int load(const char *path, File *file) {
    FILE *in = fopen(path, "rb");
    if (!in) return fail_read(path, "cannot be opened");
    if (fseek(in, 0, SEEK_END) != 0) { fclose(in); return fail_read(path, "cannot be read"); }
    long size = ftell(in);
    rewind(in);
    if (size < 8) { fclose(in); return fail_read(path, "shorter than the 8-byte header length"); }
    file->bytes = malloc((size_t)size);
    if (!file->bytes || fread(file->bytes, 1, (size_t)size, in) != (size_t)size) {
        fclose(in);
        return fail_read(path, "cannot be read");
    }
    fclose(in);
    file->size = (size_t)size;
    uint64_t length = 0;
    for (int i = 7; i >= 0; i--) length = (length << 8) | file->bytes[i];
    if (length > file->size - 8) return fail_read(path, "header length exceeds the file");
    char *header = malloc((size_t)length + 1);
    if (!header) return fail_read(path, "out of memory");
    memcpy(header, file->bytes + 8, (size_t)length);
    header[length] = '\0';
    file->header = header;
    file->data = 8 + (size_t)length;
    return 1;
}

/* The header's object for key NAME: the text after `"NAME":{`, or NULL. A match counts only where
 * a key can stand (after `{` or `,`, blanks aside), so a name inside another name is no match. */
static const char *entry(const char *header, const char *name) {
    size_t n = strlen(name);
    for (const char *at = strstr(header, "\""); at; at = strstr(at + 1, "\"")) {
        if (strncmp(at + 1, name, n) != 0 || at[1 + n] != '"') continue;
        const char *before = at;
        while (before > header && (before[-1] == ' ' || before[-1] == '\n')) before--;
        if (before == header || (before[-1] != '{' && before[-1] != ',')) continue;
        const char *after = at + n + 2;
        while (*after == ' ' || *after == '\n') after++;
        if (*after != ':') continue;
        after++;
        while (*after == ' ' || *after == '\n') after++;
        if (*after == '{') return after + 1;
    }
    return NULL;
}

/* The value after `"FIELD":` within the object that starts at OBJECT (which ends at its `}`). */
static const char *field(const char *object, const char *name) {
    const char *end = strchr(object, '}');
    char key[32];
    snprintf(key, sizeof key, "\"%s\"", name);
    const char *at = strstr(object, key);
    if (!at || (end && at > end)) return NULL;
    at += strlen(key);
    while (*at == ' ' || *at == ':') at++;
    return at;
}

static size_t dtype_size(const char *dtype) {
    if (!strcmp(dtype, "F64") || !strcmp(dtype, "I64")) return 8;
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    if (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16")) return 2;
    if (!strcmp(dtype, "U8")) return 1;
    return 0;
}

static int tensor(const File *file, const char *name, Tensor *out) {
    const char *object = entry(file->header, name);
    if (!object) return fail_read(name, "not in the vector");
    const char *dtype = field(object, "dtype"), *shape = field(object, "shape");
    const char *offsets = field(object, "data_offsets");
    if (!dtype || *dtype != '"' || !shape || *shape != '[' || !offsets || *offsets != '[')
        return fail_read(name, "needs dtype, shape and data_offsets");
    size_t k = 0;
    for (dtype++; *dtype && *dtype != '"' && k < sizeof out->dtype - 1; dtype++) out->dtype[k++] = *dtype;
    out->dtype[k] = '\0';
    out->rank = 0;
    out->count = 1;
    for (const char *at = shape + 1; *at != ']';) {
        char *next;
        unsigned long long size = strtoull(at, &next, 10);
        if (next == at || out->rank == 8) return fail_read(name, "shape is not a list of sizes");
        out->shape[out->rank++] = (size_t)size;
        out->count *= (size_t)size;
        at = next;
        while (*at == ',' || *at == ' ') at++;
    }
    char *next;
    unsigned long long begin = strtoull(offsets + 1, &next, 10);
    while (*next == ',' || *next == ' ') next++;
    unsigned long long end = strtoull(next, NULL, 10);
    size_t itemsize = dtype_size(out->dtype);
    if (!itemsize) return fail_read(name, "dtype not read here");
    if (end < begin || end > file->size - file->data || end - begin != out->count * itemsize)
        return fail_read(name, "data_offsets do not fit its dtype and shape or the file");
    out->data = file->bytes + file->data + begin;
    return 1;
}

static double f64_at(const Tensor *t, size_t i) {
    double v;
    memcpy(&v, t->data + 8 * i, 8);
    return v;
}

static float f32_at(const Tensor *t, size_t i) {
    float v;
    memcpy(&v, t->data + 4 * i, 4);
    return v;
}

static float bits_to_f32(uint32_t bits) {
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    if (exponent == 0) {
        float v = ldexpf((float)mantissa, -24);
        return sign ? -v : v;
    }
    if (exponent == 31) return bits_to_f32(sign | 0x7F800000u | (mantissa << 13));
    return bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/* fp32 to fp16, round to nearest even. */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7FFFFFFFu;
    if (magnitude >= 0x7F800000u) return (uint16_t)(sign | (magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u));
    if (magnitude >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* 65520 and up round to inf */
    if (magnitude < 0x38800000u) {                                     /* below 2^-14: subnormal */
        float a = bits_to_f32(magnitude);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    uint32_t h = magnitude - 0x38000000u;
    h += 0x0FFFu + ((h >> 13) & 1u);
    return (uint16_t)(sign | (h >> 13));
}

/* fp32 to bf16, round to nearest even. */
static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Element I of a parameter tensor (F32, BF16 or F16) as fp32. */
static float param_at(const Tensor *t, size_t i) {
    if (!strcmp(t->dtype, "F32")) return f32_at(t, i);
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    return !strcmp(t->dtype, "BF16") ? bits_to_f32((uint32_t)h << 16) : f16_to_f32(h);
}

/* An fp32 result rounded to the parameter's dtype, as a double. */
static double round_to(const char *dtype, float v) {
    if (!strcmp(dtype, "BF16")) return (double)bits_to_f32((uint32_t)f32_to_bf16(v) << 16);
    if (!strcmp(dtype, "F16")) return (double)f16_to_f32(f32_to_f16(v));
    return (double)v;
}

static int scalar(const File *file, const char *param, const char *key, double *out) {
    char name[256];
    Tensor t;
    snprintf(name, sizeof name, "%s.%s", param, key);
    if (!tensor(file, name, &t)) return 0;
    if (strcmp(t.dtype, "F64") || t.count != 1) return fail_read(name, "not one F64 value");
    *out = f64_at(&t, 0);
    return 1;
}

static int named(const File *file, const char *param, const char *key, const char *dtype, Tensor *t) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", param, key);
    if (!tensor(file, name, t)) return 0;
    if (dtype && strcmp(t->dtype, dtype)) return fail_read(name, "has another dtype than expected");
    return 1;
}

/* 1 when every element of PARAM's update is within its bound, 0 when one is not, -1 unreadable. */
static int check_parameter(const File *file, const char *param) {
    Tensor codebook, p0, vmean, index, magnitude, expected, allowed;
    double lr, wd, eps, bc1, bc2;
    if (!tensor(file, "codebook", &codebook) || strcmp(codebook.dtype, "F32") || codebook.count != 256 ||
        !named(file, param, "param", NULL, &p0) || !named(file, param, "reference.vmean", "F32", &vmean) ||
        !named(file, param, "reference.m_codebook", "U8", &index) ||
        !named(file, param, "reference.m_magnitude", "F32", &magnitude) ||
        !named(file, param, "expected.param", "F64", &expected) ||
        !named(file, param, "allowed.param", "F64", &allowed) || !scalar(file, param, "lr", &lr) ||
        !scalar(file, param, "weight_decay", &wd) || !scalar(file, param, "eps", &eps) ||
        !scalar(file, param, "bc1", &bc1) || !scalar(file, param, "bc2", &bc2))
        return -1;
    if (strcmp(p0.dtype, "F32") && strcmp(p0.dtype, "BF16") && strcmp(p0.dtype, "F16")) {
        fail_read(param, "parameter dtype is not F32, BF16 or F16");
        return -1;
    }
    size_t n = p0.count, blocks = vmean.count;
    if (!blocks || index.count != n || magnitude.count != blocks || n % blocks || expected.count != n ||
        allowed.count != n) {
        fail_read(param, "tensors of the block step do not fit one another");
        return -1;
    }
    size_t period = n / blocks, outside = 0;
    const float flr = (float)lr, decay = 1.0f - flr * (float)wd;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / period;
        float stepsize = (1.0f / (float)bc1) / (sqrtf(f32_at(&vmean, b) / (float)bc2) + (float)eps);
        float momentum = f32_at(&codebook, index.data[i]) * f32_at(&magnitude, b);
        double p1 = round_to(p0.dtype, param_at(&p0, i) * decay - flr * stepsize * momentum);
        double want = f64_at(&expected, i), room = f64_at(&allowed, i);
        if (!(fabs(p1 - want) <= room)) {
            if (outside < FIRST)
                printf("  %s[%zu]: expected %.9g, observed %.9g, allowed %.3g\n", param, i, want, p1, room);
            outside++;
        }
    }
    if (outside)
        printf("FAIL %s: %zu of %zu elements outside their bounds\n", param, outside, n);
    else
        printf("PASS %s: %zu elements within their bounds\n", param, n);
    return outside == 0;
}

int main(int argc, char **argv) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        fprintf(stderr, "vector_check: safetensors data is little-endian; this host is not\n");
        return 2;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: vector_check VECTOR.safetensors NAME [NAME ...]\n");
        return 2;
    }
    File file;
    if (!load(argv[1], &file)) return 2;
    int failed = 0;
    for (int a = 2; a < argc; a++) {
        int ok = check_parameter(&file, argv[a]);
        if (ok < 0) return 2;
        failed |= !ok;
    }
    return failed ? 1 : 0;
}
