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

/* Marlin MXFP4 weights (gptq_marlin_repack, 4-bit): src [experts, n_src, kb_src] packed bytes -> dst
 * int32 [experts, kbytes / 8, rows / 64, 128], zero-padded to rows x kbytes. Units u in [u0, u1) are
 * (expert, 64-row tile) pairs, u = e * (rows / 64) + tile. Word (kt, tile, l8, l4, warp) takes from
 * rows n = 64 tile + 16 warp + l8 (c = 0) and n + 8 (c = 1) the bytes kb = 8 kt + l4 (a = 0) and kb + 4
 * (a = 1); its byte 2h + c holds the h-th nibbles of the a = 0 byte (low) and the a = 1 byte (high).
 * zero_row: kb_src zero bytes, read for padding rows. */
void marlin_weights_pack(const uint8_t *src, uint32_t *dst, int64_t u0, int64_t u1, int64_t n_src, int64_t kb_src,
                         int64_t rows, int64_t kbytes, const uint8_t *zero_row) {
    int64_t tiles = rows / 64, k16 = kbytes / 8;
    for (int64_t u = u0; u < u1; u++) {
        int64_t e = u / tiles, tile = u % tiles;
        const uint8_t *row[64];
        for (int i = 0; i < 64; i++) {
            int64_t n = 64 * tile + i;
            row[i] = n < n_src ? src + (e * n_src + n) * kb_src : zero_row;
        }
        for (int64_t kt = 0; kt < k16; kt++) {
            uint32_t *out = dst + ((e * k16 + kt) * tiles + tile) * 128;
            if (8 * kt >= kb_src) {  /* kb_src % 8 == 0: a whole padding step */
                memset(out, 0, 128 * sizeof(uint32_t));
                continue;
            }
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
    }
}
