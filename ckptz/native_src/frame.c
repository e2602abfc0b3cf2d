/*
 * Whole frames (decode_frame): every plane of a frame decoded here and the words merged in
 * one call, without the GIL, or nothing, so the Python codecs decode (or reject) the frame.
 */
#include "native.h"

/* The bitstreams frame_decode() handles itself. The ids are ckptz/codecs/table.py's;
 * tests/test_table.py holds this enum against that table. */
enum { CODEC_RAW = 0, CODEC_CONST = 1, CODEC_ZSTD = 2, CODEC_BITPACK = 6, CODEC_HUFF1 = 7, CODEC_HUFF2D = 8, CODEC_SIGN2D = 9,
       CODEC_HUFFEXP = 10 };

/* Checks what is cheap to check about a chunk of `size` bytes, n expected: a raw or const
 * payload's size, a bitpack payload's header and size, that a chunk is zstd, huff1, huff2d, sign2d or huffexp (its
 * frames are frame_decode's to check). Sets where merge will read the plane: the payload
 * (raw), a constant byte (const), or `room`, where frame_decode puts it. */
static int frame_chunk_usable(const chunk_t *chunk, size_t size, size_t n, uint8_t *room, plane_t *plane) {
    const uint8_t *bytes = chunk->bytes;
    size_t len = chunk->len;
    int bits[8];
    plane->bytes = room;
    plane->value = 0;
    if (size != n) return 0;
    if (chunk->codec == CODEC_RAW) {
        plane->bytes = bytes;
        return len == n;
    }
    if (chunk->codec == CODEC_CONST) {
        plane->bytes = NULL;
        plane->value = len ? bytes[0] : 0;
        return len == 1;
    }
    if (chunk->codec == CODEC_BITPACK)
        return len >= 2 && !(bytes[1] & ~bytes[0]) && len - 2 == (size_t)varying_list(bytes[0], bits) * ((n + 7) / 8);
    return chunk->codec == CODEC_ZSTD || chunk->codec == CODEC_HUFF1 || chunk->codec == CODEC_HUFF2D ||
           chunk->codec == CODEC_SIGN2D || chunk->codec == CODEC_HUFFEXP;
}

/* Whether a chunk's bitstream decodes with a zstd literal table (and, but zstd, a scratch of
 * a plane's size for its groups). */
static int frame_chunk_tabled(int codec) {
    return codec == CODEC_ZSTD || codec == CODEC_HUFF1 || codec == CODEC_HUFF2D || codec == CODEC_SIGN2D ||
           codec == CODEC_HUFFEXP;
}

/* Decodes the planes of `word` chunks that frame_chunk_usable accepted (plane k into
 * room + k * n) and merges the words into dst. The top plane is decoded first, as a
 * huffexp plane's contexts are its bytes (a huffexp top plane, or one of a single-byte word,
 * is malformed). A zstd frame libzstd must decode (alone, or one of a huff1 payload's
 * groups) is found by its block headers before any work; 0 then, or if a payload is
 * malformed, and dst is untouched. `dt` is scratch for zstd, huff1, huff2d, sign2d and
 * huffexp chunks (unused without them). */
static int frame_decode(const chunk_t *chunks, plane_t *planes, int word, size_t n, uint8_t *room, uint8_t *dst,
                        int rotate, dtable_t *dt) {
    int usable = 1;
    uint8_t *groups = NULL;
    for (int k = 0; usable && k < word; k++)
        if (chunks[k].codec == CODEC_ZSTD) {
            usable = literals_frame(chunks[k].bytes, chunks[k].len, NULL, n, dt, 0);
        } else if (chunks[k].codec == CODEC_HUFF1 || chunks[k].codec == CODEC_HUFFEXP) {
            usable = order1_usable(chunks[k].bytes, chunks[k].len, n, dt) &&
                     (chunks[k].codec == CODEC_HUFF1 || k + 1 < word);
            if (usable && !groups) usable = (groups = malloc(n ? n : 1)) != NULL;
        } else if (chunks[k].codec == CODEC_HUFF2D || chunks[k].codec == CODEC_SIGN2D) {
            usable = chunks[k].codec == CODEC_HUFF2D ? order2d_usable(chunks[k].bytes, chunks[k].len, n, dt)
                                                     : sign2d_usable(chunks[k].bytes, chunks[k].len, n, dt);
            if (usable && !groups) usable = (groups = malloc(n ? n : 1)) != NULL;
        }
    for (int k = word - 1; usable && k >= 0; k--) {
        uint8_t *plane = room + (size_t)k * n;
        const uint8_t *in = chunks[k].bytes;
        if (chunks[k].codec == CODEC_ZSTD) {
            usable = literals_frame(in, chunks[k].len, plane, n, dt, 1);
        } else if (chunks[k].codec == CODEC_HUFF1) {
            usable = order1_decode(in, chunks[k].len, plane, n, groups, dt);
        } else if (chunks[k].codec == CODEC_HUFF2D) {
            usable = order2d_decode(in, chunks[k].len, plane, n, groups, dt);
        } else if (chunks[k].codec == CODEC_SIGN2D) {
            usable = sign2d_decode(in, chunks[k].len, plane, n, groups, dt);
        } else if (chunks[k].codec == CODEC_HUFFEXP) {
            const uint8_t *ctx = huffexp_context(&planes[word - 1], room + (size_t)(word - 1) * n, n);
            usable = huffexp_decode(in, chunks[k].len, plane, n, ctx, groups, dt);
        } else if (chunks[k].codec == CODEC_BITPACK) {
            int bits[8], count = varying_list(in[0], bits);
            unpack_rows(in + 2, (n + 7) / 8, bits, count, in[1], plane, n);
        }
    }
    free(groups);
    if (usable) merge_words(planes, dst, n, word, rotate);
    return usable;
}
