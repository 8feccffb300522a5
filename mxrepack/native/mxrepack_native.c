/* Byte-level loops for the layouts whose permutations move single bytes and bits, where numpy needs a
 * table gather per 16 bits and many passes. Built on first use by mxrepack/native/__init__.py; every
 * function has a numpy twin in its layout module, and the tests compare the two byte for byte.
 * Tables come from Python, so each layout's bit rules are defined once, there. */
#include <stdint.h>
#include <string.h>

/* triton-hopper values (HopperMXValueLayout, mx_axis=1) on 16-row blocks: block b is src rows
 * [16b, 16b + 16) of kb bytes and dst rows [4b, 4b + 4) of 4 * kb bytes (kb % 32 == 0). With
 * n = 8 w0 + 2 t0 + s0 and k = 32 c + 8 kt + 4 w1 + t1, byte (n, k) goes to dst row t0, word
 * 32 c + 16 s0 + 4 t1 + kt, byte 2 w1 + w0 of that word; each word is then bit-permuted: luts[256 j + v] is
 * the word that byte value v at byte j becomes. */
void hopper_values_pack(const uint8_t *src, uint8_t *dst, int64_t blocks, int64_t kb, const uint32_t *luts) {
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *s = src + b * 16 * kb;
        uint32_t *d = (uint32_t *)(dst + b * 16 * kb);
        for (int t0 = 0; t0 < 4; t0++) {
            uint32_t *row = d + t0 * kb;  /* 4 * kb bytes = kb words */
            for (int s0 = 0; s0 < 2; s0++) {
                const uint8_t *r0 = s + (2 * t0 + s0) * kb, *r1 = r0 + 8 * kb;  /* w0 = 0, 1 */
                for (int64_t c = 0; c < kb / 32; c++) {
                    uint32_t *out = row + 32 * c + 16 * s0;
                    for (int t1 = 0; t1 < 4; t1++) {
                        for (int kt = 0; kt < 4; kt++) {
                            int64_t k = 32 * c + 8 * kt + t1;
                            out[4 * t1 + kt] = luts[r0[k]] | luts[256 + r1[k]] | luts[512 + r0[k + 4]] | luts[768 + r1[k + 4]];
                        }
                    }
                }
            }
        }
    }
}

/* strided order wgmma: each 32-bit word's bits permuted in place; luts[256 j + v] is the word that byte value v at
 * byte j becomes (the permutation of a word is the OR of its bytes' images). */
void permute_word_bits(uint32_t *words, int64_t n, const uint32_t *luts) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t w = words[i];
        words[i] = luts[w & 255] | luts[256 + ((w >> 8) & 255)] | luts[512 + ((w >> 16) & 255)] | luts[768 + (w >> 24)];
    }
}

/* The inverse: luts[256 j + v] is the word whose byte j holds v before the pack's bit permutation. */
void hopper_values_unpack(const uint8_t *src, uint8_t *dst, int64_t blocks, int64_t kb, const uint32_t *luts) {
    for (int64_t b = 0; b < blocks; b++) {
        const uint32_t *s = (const uint32_t *)(src + b * 16 * kb);
        uint8_t *d = dst + b * 16 * kb;
        for (int t0 = 0; t0 < 4; t0++) {
            const uint32_t *row = s + t0 * kb;
            for (int s0 = 0; s0 < 2; s0++) {
                uint8_t *r0 = d + (2 * t0 + s0) * kb, *r1 = r0 + 8 * kb;
                for (int64_t c = 0; c < kb / 32; c++) {
                    const uint32_t *in = row + 32 * c + 16 * s0;
                    for (int t1 = 0; t1 < 4; t1++) {
                        for (int kt = 0; kt < 4; kt++) {
                            uint32_t w = in[4 * t1 + kt];
                            uint32_t v = luts[w & 255] | luts[256 + ((w >> 8) & 255)] | luts[512 + ((w >> 16) & 255)]
                                         | luts[768 + (w >> 24)];
                            int64_t k = 32 * c + 8 * kt + t1;
                            r0[k] = (uint8_t)v;
                            r1[k] = (uint8_t)(v >> 8);
                            r0[k + 4] = (uint8_t)(v >> 16);
                            r1[k + 4] = (uint8_t)(v >> 24);
                        }
                    }
                }
            }
        }
    }
}

/* The same two loops with AVX-512 (VBMI), where the CPU has it (native_simd() says so). Per (block, t0, s0, c),
 * the 32 bytes of r0 and of r1 that make 16 output words sit in one 64-byte register; one byte permute puts
 * them in word order, and the bit permutation is a handful of (rotate, mask) pairs -- every source bit that
 * moves by the same distance (mod 32) is one pair: word' = OR_g (rotl(word, rot[g]) & mask[g]). The pairs come
 * from Python (the same bit map as the tables). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SIMD_ATTR __attribute__((target("avx512f,avx512bw,avx512vbmi")))

/* Whole 64-byte lines of an output that is written once and read next by another thread (the shard writer):
 * streaming stores skip reading each line into the cache first (1.2-1.7x on the pack loops here). They need
 * 64-byte aligned addresses; an output that is not gets ordinary stores. Callers end with _mm_sfence(). */
SIMD_ATTR static inline void store_line(void *p, __m512i v, int stream) {
    if (stream)
        _mm512_stream_si512(p, v);
    else
        _mm512_storeu_si512(p, v);
}
#define ALIGNED64(p) ((((uintptr_t)(p)) & 63) == 0)

int native_simd(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
}

/* out byte 4 (4 t1 + kt) + j of a 16-word group <- z byte (j odd: r1 half, +32) 8 kt + t1 (+4 for j >= 2) */
static void hopper_word_order(uint8_t idx[64]) {
    for (int t1 = 0; t1 < 4; t1++)
        for (int kt = 0; kt < 4; kt++)
            for (int j = 0; j < 4; j++)
                idx[4 * (4 * t1 + kt) + j] = (uint8_t)(32 * (j & 1) + 8 * kt + t1 + 4 * (j >> 1));
}

SIMD_ATTR static inline __m512i permute_bits(__m512i w, const __m512i *rot, const __m512i *mask, int groups) {
    __m512i o = _mm512_setzero_si512();
    for (int g = 0; g < groups; g++)
        o = _mm512_ternarylogic_epi32(o, _mm512_rolv_epi32(w, rot[g]), mask[g], 0xF8);  /* o | (rotl & mask) */
    return o;
}

SIMD_ATTR void hopper_values_pack_simd(const uint8_t *src, uint8_t *dst, int64_t blocks, int64_t kb,
                                       const uint32_t *rots, const uint32_t *masks, int groups) {
    uint8_t order[64];
    hopper_word_order(order);
    __m512i idx = _mm512_loadu_si512(order), rot[32], mask[32];
    for (int g = 0; g < groups && g < 32; g++) {
        rot[g] = _mm512_set1_epi32((int)rots[g]);
        mask[g] = _mm512_set1_epi32((int)masks[g]);
    }
    int stream = ALIGNED64(dst);  /* with kb % 32 == 0, every 64-byte store then starts a line */
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *s = src + b * 16 * kb;
        uint8_t *d = dst + b * 16 * kb;
        for (int t0 = 0; t0 < 4; t0++) {
            uint8_t *row = d + t0 * 4 * kb;
            for (int s0 = 0; s0 < 2; s0++) {
                const uint8_t *r0 = s + (2 * t0 + s0) * kb, *r1 = r0 + 8 * kb;
                for (int64_t c = 0; c < kb / 32; c++) {
                    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(r0 + 32 * c))),
                                                   _mm256_loadu_si256((const __m256i *)(r1 + 32 * c)), 1);
                    __m512i w = permute_bits(_mm512_permutexvar_epi8(idx, z), rot, mask, groups);
                    store_line(row + 4 * (32 * c + 16 * s0), w, stream);
                }
            }
        }
    }
    _mm_sfence();
}

SIMD_ATTR void hopper_values_unpack_simd(const uint8_t *src, uint8_t *dst, int64_t blocks, int64_t kb,
                                         const uint32_t *rots, const uint32_t *masks, int groups) {
    uint8_t order[64], inverse[64];
    hopper_word_order(order);
    for (int o = 0; o < 64; o++)
        inverse[order[o]] = (uint8_t)o;
    __m512i idx = _mm512_loadu_si512(inverse), rot[32], mask[32];
    for (int g = 0; g < groups && g < 32; g++) {
        rot[g] = _mm512_set1_epi32((int)rots[g]);
        mask[g] = _mm512_set1_epi32((int)masks[g]);
    }
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *s = src + b * 16 * kb;
        uint8_t *d = dst + b * 16 * kb;
        for (int t0 = 0; t0 < 4; t0++) {
            const uint8_t *row = s + t0 * 4 * kb;
            for (int s0 = 0; s0 < 2; s0++) {
                uint8_t *r0 = d + (2 * t0 + s0) * kb, *r1 = r0 + 8 * kb;
                for (int64_t c = 0; c < kb / 32; c++) {
                    __m512i w = permute_bits(_mm512_loadu_si512(row + 4 * (32 * c + 16 * s0)), rot, mask, groups);
                    __m512i z = _mm512_permutexvar_epi8(idx, w);
                    _mm256_storeu_si256((__m256i *)(r0 + 32 * c), _mm512_castsi512_si256(z));
                    _mm256_storeu_si256((__m256i *)(r1 + 32 * c), _mm512_extracti64x4_epi64(z, 1));
                }
            }
        }
    }
}
#else
int native_simd(void) { return 0; }
void hopper_values_pack_simd(const uint8_t *src, uint8_t *dst, int64_t blocks, int64_t kb, const uint32_t *rots,
                             const uint32_t *masks, int groups) {}
void hopper_values_unpack_simd(const uint8_t *src, uint8_t *dst, int64_t blocks, int64_t kb, const uint32_t *rots,
                               const uint32_t *masks, int groups) {}
#endif

/* Marlin MXFP4 weights (gptq_marlin_repack, 4-bit): src [experts, n_src, kb_src] packed bytes -> dst
 * int32 [experts, kbytes / 8, rows / 64, 128], zero-padded to rows x kbytes. Units u in [u0, u1) are
 * (expert, 64-row tile) pairs, u = e * (rows / 64) + tile. Word (kt, tile, l8, l4, warp) takes from
 * rows n = 64 tile + 16 warp + l8 (c = 0) and n + 8 (c = 1) the bytes kb = 8 kt + l4 (a = 0) and kb + 4
 * (a = 1); its byte 2h + c holds the h-th nibbles of the a = 0 byte (low) and the a = 1 byte (high).
 * zero_row: kb_src zero bytes, read for padding rows. */
/* One (expert, tile, kt) step of the Marlin loop: 128 words from bytes 8 kt .. 8 kt + 7 of the tile's 64 rows. */
static void marlin_step(const uint8_t *const row[64], uint32_t *out, int64_t kt) {
    for (int l8 = 0; l8 < 8; l8++) {
        for (int warp = 0; warp < 4; warp++) {
            /* rows c = 0, 1: bytes 8 kt .. 8 kt + 7 = l4 0..3 of a = 0, then of a = 1 */
            uint64_t x0, x1;
            memcpy(&x0, row[16 * warp + l8] + 8 * kt, 8);
            memcpy(&x1, row[16 * warp + l8 + 8] + 8 * kt, 8);
            uint32_t a0 = (uint32_t)x0, a1 = (uint32_t)(x0 >> 32), b0 = (uint32_t)x1, b1 = (uint32_t)(x1 >> 32);
            /* byte l4 of o<2h + c>: nibble h of the a = 0 byte (low) and of the a = 1 byte (high) */
            uint32_t o0 = (a0 & 0x0F0F0F0F) | ((a1 & 0x0F0F0F0F) << 4), o2 = ((a0 >> 4) & 0x0F0F0F0F) | (a1 & 0xF0F0F0F0);
            uint32_t o1 = (b0 & 0x0F0F0F0F) | ((b1 & 0x0F0F0F0F) << 4), o3 = ((b0 >> 4) & 0x0F0F0F0F) | (b1 & 0xF0F0F0F0);
            /* 4x4 byte transpose: word l4 = byte l4 of o0, o1, o2, o3 */
            uint32_t t0 = (o0 & 0x00FF00FF) | ((o1 & 0x00FF00FF) << 8), t1 = ((o0 >> 8) & 0x00FF00FF) | (o1 & 0xFF00FF00);
            uint32_t t2 = (o2 & 0x00FF00FF) | ((o3 & 0x00FF00FF) << 8), t3 = ((o2 >> 8) & 0x00FF00FF) | (o3 & 0xFF00FF00);
            uint32_t *w = out + 16 * l8 + warp;
            w[0] = (t0 & 0xFFFF) | (t2 << 16);
            w[4] = (t1 & 0xFFFF) | (t3 << 16);
            w[8] = (t0 >> 16) | (t2 & 0xFFFF0000);
            w[12] = (t1 >> 16) | (t3 & 0xFFFF0000);
        }
    }
}

#ifdef SIMD_ATTR
/* Eight kt steps at once: each row's 64 bytes 64 g .. 64 g + 63 are one register, one 64-bit lane per kt, and
 * marlin_step's word arithmetic runs on the eight lanes (low 32 bits of each). A (l8, warp) pair gives four
 * registers of words (i = 0..3, word 16 l8 + 4 i + warp of each kt's block); for one l8 the sixteen (i, warp)
 * registers pair up into eight of 64-bit (r, r + 1) lanes, and an 8x8 transpose of 64-bit lanes turns them into
 * each kt block's 64 bytes at word 16 l8. */
SIMD_ATTR static void marlin_steps8(const uint8_t *const row[64], uint32_t *const out[8], int64_t g, int stream) {
    /* 64 rows are 64 streams, more than the hardware prefetcher follows: ask for each row's line 4 steps on */
    for (int i = 0; i < 64; i++)
        _mm_prefetch((const char *)(row[i] + 64 * (g + 4)), _MM_HINT_T0);
    const __m512i lo4 = _mm512_set1_epi64(0x0F0F0F0F), hi4 = _mm512_set1_epi64(0xF0F0F0F0);
    const __m512i lo8 = _mm512_set1_epi32(0x00FF00FF), hi8 = _mm512_set1_epi32((int)0xFF00FF00);
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF), hi16 = _mm512_set1_epi32((int)0xFFFF0000);
    for (int l8 = 0; l8 < 8; l8++) {
        __m512i q[8];
        for (int warp = 0; warp < 4; warp++) {
            __m512i x0 = _mm512_loadu_si512(row[16 * warp + l8] + 64 * g);
            __m512i x1 = _mm512_loadu_si512(row[16 * warp + l8 + 8] + 64 * g);
            __m512i o0 = _mm512_or_si512(_mm512_and_si512(x0, lo4), _mm512_and_si512(_mm512_srli_epi64(x0, 28), hi4));
            __m512i o2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(x0, 4), lo4), _mm512_and_si512(_mm512_srli_epi64(x0, 32), hi4));
            __m512i o1 = _mm512_or_si512(_mm512_and_si512(x1, lo4), _mm512_and_si512(_mm512_srli_epi64(x1, 28), hi4));
            __m512i o3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(x1, 4), lo4), _mm512_and_si512(_mm512_srli_epi64(x1, 32), hi4));
            __m512i t0 = _mm512_or_si512(_mm512_and_si512(o0, lo8), _mm512_slli_epi32(_mm512_and_si512(o1, lo8), 8));
            __m512i t1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(o0, 8), lo8), _mm512_and_si512(o1, hi8));
            __m512i t2 = _mm512_or_si512(_mm512_and_si512(o2, lo8), _mm512_slli_epi32(_mm512_and_si512(o3, lo8), 8));
            __m512i t3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(o2, 8), lo8), _mm512_and_si512(o3, hi8));
            __m512i w[4] = {_mm512_or_si512(_mm512_and_si512(t0, lo16), _mm512_slli_epi32(t2, 16)),
                            _mm512_or_si512(_mm512_and_si512(t1, lo16), _mm512_slli_epi32(t3, 16)),
                            _mm512_or_si512(_mm512_srli_epi32(t0, 16), _mm512_and_si512(t2, hi16)),
                            _mm512_or_si512(_mm512_srli_epi32(t1, 16), _mm512_and_si512(t3, hi16))};
            /* r = 4 i + warp; lane pair m = r / 2 holds r (low) and r + 1 (high); high halves are zero */
            for (int i = 0; i < 4; i++) {
                int r = 4 * i + warp;
                q[r / 2] = (r & 1) ? _mm512_or_si512(q[r / 2], _mm512_slli_epi64(w[i], 32)) : w[i];
            }
        }
        /* 8x8 transpose of 64-bit lanes: u[k] lane m = q[m] lane k */
        __m512i t[8], v[8];
        for (int m = 0; m < 8; m += 2) {
            t[m] = _mm512_unpacklo_epi64(q[m], q[m + 1]);      /* lanes 0,2,4,6 of q[m], q[m+1] interleaved */
            t[m + 1] = _mm512_unpackhi_epi64(q[m], q[m + 1]);  /* lanes 1,3,5,7 */
        }
        for (int m = 0; m < 8; m += 4) {
            for (int h = 0; h < 2; h++) {
                v[m + h] = _mm512_shuffle_i64x2(t[m + h], t[m + h + 2], 0x88);      /* 128-bit blocks 0, 2 */
                v[m + h + 2] = _mm512_shuffle_i64x2(t[m + h], t[m + h + 2], 0xDD);  /* blocks 1, 3 */
            }
        }
        for (int h = 0; h < 4; h++) {
            __m512i a = _mm512_shuffle_i64x2(v[h], v[h + 4], 0x88), b = _mm512_shuffle_i64x2(v[h], v[h + 4], 0xDD);
            /* v[0]: k in {0, 4} (a: 0, b: 4), v[1]: {1, 5}, v[2]: {2, 6}, v[3]: {3, 7} */
            store_line(out[h] + 16 * l8, a, stream);
            store_line(out[h + 4] + 16 * l8, b, stream);
        }
    }
}
#endif

static void marlin_weights_pack_impl(const uint8_t *src, uint32_t *dst, int64_t u0, int64_t u1, int64_t n_src, int64_t kb_src,
                                     int64_t rows, int64_t kbytes, const uint8_t *zero_row, int simd) {
    int64_t tiles = rows / 64, k16 = kbytes / 8;
    for (int64_t u = u0; u < u1; u++) {
        int64_t e = u / tiles, tile = u % tiles;
        const uint8_t *row[64];
        for (int i = 0; i < 64; i++) {
            int64_t n = 64 * tile + i;
            row[i] = n < n_src ? src + (e * n_src + n) * kb_src : zero_row;
        }
        int64_t kt = 0;
#ifdef SIMD_ATTR
        if (simd) {
            for (; 8 * kt + 64 <= kb_src; kt += 8) {
                uint32_t *out[8];
                for (int q = 0; q < 8; q++)
                    out[q] = dst + ((e * k16 + kt + q) * tiles + tile) * 128;
                marlin_steps8(row, out, kt / 8, ALIGNED64(dst));
            }
        }
#endif
        for (; kt < k16; kt++) {
            uint32_t *out = dst + ((e * k16 + kt) * tiles + tile) * 128;
            if (8 * kt >= kb_src)  /* kb_src % 8 == 0: a whole padding step */
                memset(out, 0, 128 * sizeof(uint32_t));
            else
                marlin_step(row, out, kt);
        }
    }
}

void marlin_weights_pack(const uint8_t *src, uint32_t *dst, int64_t u0, int64_t u1, int64_t n_src, int64_t kb_src,
                         int64_t rows, int64_t kbytes, const uint8_t *zero_row) {
    marlin_weights_pack_impl(src, dst, u0, u1, n_src, kb_src, rows, kbytes, zero_row, 0);
}

void marlin_weights_pack_simd(const uint8_t *src, uint32_t *dst, int64_t u0, int64_t u1, int64_t n_src, int64_t kb_src,
                              int64_t rows, int64_t kbytes, const uint8_t *zero_row) {
    marlin_weights_pack_impl(src, dst, u0, u1, n_src, kb_src, rows, kbytes, zero_row, 1);
#ifdef SIMD_ATTR
    _mm_sfence();
#endif
}

/* MXFP4 -> BF16 in one pass: table value times the group's power of two, in fp32. Every product is exact
 * (at most 4 significant bits, fp32 subnormals reach 2^-149) or overflows to inf, so its top 16 bits are the
 * BF16 that rounding would give: the same bits as torch's bf16 multiply of the table value by the bf16 scale.
 * blocks: [rows, groups, 16] bytes (low nibble = even element); scales: [rows, groups] E8M0 bytes. */
static const float E2M1_F32[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline float e8m0_f32(uint8_t s) {
    uint32_t u = s ? (uint32_t)s << 23 : 1u << 22; /* byte 0 is 2^-127, an fp32 subnormal */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* one group: 16 bytes -> 32 values at dst[0], dst[step], ... */
static inline void mxfp4_group(const uint8_t *p, uint8_t s, uint16_t *dst, int64_t step) {
    const float sc = e8m0_f32(s);
    for (int j = 0; j < 16; j++) {
        dst[(2 * j) * step] = bf16_bits(E2M1_F32[p[j] & 15] * sc);
        dst[(2 * j + 1) * step] = bf16_bits(E2M1_F32[p[j] >> 4] * sc);
    }
}

/* rows r0..r1 -> out [rows, 32 groups] (row-major, the checkpoint's element order) */
void mxfp4_bf16_rows(const uint8_t *blocks, const uint8_t *scales, uint16_t *out, int64_t r0, int64_t r1,
                     int64_t groups) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t g = 0; g < groups; g++)
            mxfp4_group(blocks + (r * groups + g) * 16, scales[r * groups + g], out + (r * groups + g) * 32, 1);
}

/* Transposed: matrices of `rows` x 32 `groups` -> out [32 groups, rows] each (transformers' [in, out] expert
 * weights). Work unit u = one 32-row tile of one matrix (tiles = ceil(rows / 32) per matrix). A tile's 32 rows
 * of one group fill a 32 x 32 block in L1, k-major, which then leaves as 32 runs of 64 bytes: the 2-byte
 * transpose costs no strided stores to memory. */
void mxfp4_bf16_cols(const uint8_t *blocks, const uint8_t *scales, uint16_t *out, int64_t u0, int64_t u1,
                     int64_t rows, int64_t groups) {
    const int64_t tiles = (rows + 31) / 32;
    uint16_t tile[32 * 32];
    for (int64_t u = u0; u < u1; u++) {
        const int64_t m = u / tiles, n0 = 32 * (u % tiles), nr = rows - n0 < 32 ? rows - n0 : 32;
        const uint8_t *b = blocks + (m * rows + n0) * groups * 16;
        const uint8_t *s = scales + (m * rows + n0) * groups;
        uint16_t *o = out + m * 32 * groups * rows + n0;
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t i = 0; i < nr; i++)
                mxfp4_group(b + (i * groups + g) * 16, s[i * groups + g], tile + i, 32);
            for (int k = 0; k < 32; k++)
                memcpy(o + (g * 32 + k) * rows, tile + 32 * k, (size_t)nr * 2);
        }
    }
}
