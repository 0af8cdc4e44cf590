/* SentencePiece-style BPE over a GGUF vocabulary (Gemma 3, Phi-3, Llama 2): the encoder and decoder of
 * specwise/models/spm_tokenizer.py, giving the ids and text that the `tokenizers` library gives for the
 * tokenizer.json that specwise/models/gguf_tokenizer.py builds from the same file, in a few MiB.
 *
 * Encoding, as that tokenizer does it:
 *   1. Added tokens (control, unknown and user-defined) are found in the text, leftmost first and the longest of
 *      those that start there; one that takes the whitespace after it (SPM_RSTRIP) takes it. The search goes on
 *      where the match ended (before the whitespace taken).
 *   2. Each piece of text between them: a U+2581 put before it (space_prefix, where it is not empty), every space
 *      written U+2581, each character its token, or its bytes' <0xXX> tokens where it has none (all of them, else
 *      the unknown token, runs of unknown characters fused into one).
 *   3. The pieces' symbols merged: the adjacent pair of lowest rank first, leftmost on ties, until none merges.
 *      The file's merges rank by their place (a pair given twice by its last); without them (derived merges) a
 *      pair merges where its two tokens' bytes are together a token, ranked by that token's priority group
 *      (Gemma: its id), then the longer left part, then the longer right part (in characters), then the token's id.
 * Decoding: U+2581 as a space, runs of <0xXX> tokens as their bytes (a run that is not UTF-8: U+FFFD a byte), and
 * with space_prefix one leading space removed.
 *
 * The vocabulary is built by Python (spmvocab's arrays); every entry point checks the sizes it reads by and
 * returns -1 for arguments out of range. Nothing is global: calls on one vocabulary may run in parallel.
 */
#include <stdlib.h>
#include <string.h>

#include "specwise.h"

#define SPM_BAD (-1)
#define SPM_MEMORY (-2)
#define SPM_SHORT (-3)
#define MAX_TOKEN_BYTES 65535 /* a token's length in bytes: the rank keys hold character counts in 16 bits */

static const uint8_t SPACE_MARK[3] = {0xE2, 0x96, 0x81}; /* U+2581 */

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static inline uint64_t hash_bytes(const uint8_t *s, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return mix64(h);
}

static inline int64_t token_len(const spmvocab *v, int32_t id) {
    return (int64_t)v->offsets[id + 1] - (int64_t)v->offsets[id];
}

static inline const uint8_t *token_bytes(const spmvocab *v, int32_t id) { return v->bytes + v->offsets[id]; }

/* the id of a token's bytes, or -1 */
static int32_t find(const spmvocab *v, const uint8_t *s, int64_t n) {
    uint64_t mask = (uint64_t)v->table_size - 1, at = hash_bytes(s, n) & mask;
    for (;;) {
        int32_t id = v->table[at];
        if (id < 0) return -1;
        if (token_len(v, id) == n && memcmp(token_bytes(v, id), s, (size_t)n) == 0) return id;
        at = (at + 1) & mask;
    }
}

static int power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/* the checks every entry point makes of the vocabulary (its arrays' contents: specwise_spm_index) */
static int vocab_ok(const spmvocab *v) {
    if (!v || !v->bytes || !v->offsets || !v->kinds || !v->added_lengths || !v->byte_ids) return 0;
    if (v->n < 1 || v->n > INT32_MAX - 1 || !power_of_two(v->table_size) || v->table_size <= v->n) return 0;
    if (v->longest < 0 || v->longest > MAX_TOKEN_BYTES || v->added_max < 0 || v->added_max > v->longest) return 0;
    if (v->unk < -1 || v->unk >= v->n) return 0;
    if (v->pair_keys) {
        if (!v->pair_values || !power_of_two(v->pairs_size)) return 0;
    } else if (v->pairs_size != 0) {
        return 0;
    }
    return 1;
}

int64_t specwise_spm_index(const spmvocab *v, int32_t *table) {
    if (!vocab_ok(v) || !table || table != v->table) return SPM_BAD;
    for (int64_t i = 0; i < v->n; i++) {
        if (v->offsets[i + 1] < v->offsets[i] || v->offsets[i + 1] - v->offsets[i] > (uint32_t)v->longest)
            return SPM_BAD;
        if (v->groups && (v->groups[i] < 0 || v->groups[i] >= v->n)) return SPM_BAD;
    }
    for (int i = 0; i < 256; i++)
        if (v->byte_ids[i] < -1 || v->byte_ids[i] >= v->n) return SPM_BAD;
    for (int64_t i = 0; i < v->table_size; i++) table[i] = -1;
    uint64_t mask = (uint64_t)v->table_size - 1;
    int64_t repeated = 0;
    for (int64_t id = 0; id < v->n; id++) {
        const uint8_t *s = token_bytes(v, (int32_t)id);
        int64_t len = token_len(v, (int32_t)id);
        uint64_t at = hash_bytes(s, len) & mask;
        for (;;) {
            int32_t other = table[at];
            if (other < 0) {
                table[at] = (int32_t)id;
                break;
            }
            if (token_len(v, other) == len && memcmp(token_bytes(v, other), s, (size_t)len) == 0) {
                repeated++;
                table[at] = (int32_t)id; /* the last of a repeated token, as a JSON object's keys */
                break;
            }
            at = (at + 1) & mask;
        }
    }
    return repeated;
}

int64_t specwise_spm_lookup(const spmvocab *v, const uint8_t *strings, const int64_t *offsets, int64_t n,
                            int32_t *ids) {
    if (!vocab_ok(v) || !v->table || n < 0 || (n > 0 && (!strings || !offsets || !ids))) return SPM_BAD;
    for (int64_t i = 0; i < n; i++)
        if (offsets[i] < 0 || offsets[i + 1] < offsets[i]) return SPM_BAD;
    for (int64_t i = 0; i < n; i++) ids[i] = find(v, strings + offsets[i], offsets[i + 1] - offsets[i]);
    return 0;
}

static inline uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

int64_t specwise_spm_pairs(const spmvocab *v, const int32_t *left, const int32_t *right, const int32_t *merged,
                           int64_t m, int64_t *keys, int64_t *values) {
    if (!vocab_ok(v) || !v->pair_keys || keys != v->pair_keys || values != v->pair_values || m < 0 ||
        m > INT32_MAX || v->pairs_size <= m || (m > 0 && (!left || !right || !merged)))
        return SPM_BAD;
    for (int64_t i = 0; i < m; i++)
        if (left[i] < 0 || left[i] >= v->n || right[i] < 0 || right[i] >= v->n || merged[i] < 0 ||
            merged[i] >= v->n)
            return SPM_BAD;
    for (int64_t i = 0; i < v->pairs_size; i++) keys[i] = -1;
    uint64_t mask = (uint64_t)v->pairs_size - 1;
    for (int64_t i = 0; i < m; i++) {
        uint64_t key = pair_key(left[i], right[i]), at = mix64(key) & mask;
        while (keys[at] >= 0 && (uint64_t)keys[at] != key) at = (at + 1) & mask;
        keys[at] = (int64_t)key;
        values[at] = (int64_t)(((uint64_t)i << 32) | (uint32_t)merged[i]);
    }
    return 0;
}

/* ---- encoding ----------------------------------------------------------------------------------------------- */

typedef struct {
    int32_t id, prev, next, alive;
} symbol;

typedef struct {
    uint64_t rank;  /* the merge's rank (the file's), or its group, cut and tail (derived) */
    uint32_t place; /* derived merges: the merged token's id */
    int32_t pos;    /* the left symbol */
    int32_t merged; /* the merged token */
} candidate;

typedef struct {
    symbol *symbols;
    int64_t symbols_cap;
    candidate *heap;
    int64_t heap_len, heap_cap;
    uint8_t *joined; /* two tokens' bytes together (derived merges) */
} scratch;

static inline int before(const candidate *a, const candidate *b) {
    if (a->rank != b->rank) return a->rank < b->rank;
    if (a->place != b->place) return a->place < b->place;
    return a->pos < b->pos;
}

static int heap_push(scratch *w, candidate c) {
    if (w->heap_len == w->heap_cap) {
        int64_t cap = w->heap_cap ? 2 * w->heap_cap : 64;
        candidate *grown = realloc(w->heap, (size_t)cap * sizeof(candidate));
        if (!grown) return 0;
        w->heap = grown;
        w->heap_cap = cap;
    }
    int64_t i = w->heap_len++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!before(&c, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
    return 1;
}

static candidate heap_pop(scratch *w) {
    candidate top = w->heap[0], last = w->heap[--w->heap_len];
    int64_t i = 0, n = w->heap_len;
    for (;;) {
        int64_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && before(&w->heap[child + 1], &w->heap[child])) child++;
        if (!before(&w->heap[child], &last)) break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

static inline int64_t chars_of(const uint8_t *s, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += (s[i] & 0xC0) != 0x80;
    return c;
}

/* whether the pair (left, right) merges: its rank and merged token into *c */
static int merge_of(const spmvocab *v, scratch *w, int32_t left, int32_t right, candidate *c) {
    if (v->pair_keys) {
        uint64_t key = pair_key(left, right), mask = (uint64_t)v->pairs_size - 1, at = mix64(key) & mask;
        for (;;) {
            int64_t k = v->pair_keys[at];
            if (k < 0) return 0;
            if ((uint64_t)k == key) {
                uint64_t value = (uint64_t)v->pair_values[at];
                c->rank = value >> 32;
                c->place = 0;
                c->merged = (int32_t)(value & 0xFFFFFFFFu);
                return 1;
            }
            at = (at + 1) & mask;
        }
    }
    int64_t a = token_len(v, left), b = token_len(v, right);
    memcpy(w->joined, token_bytes(v, left), (size_t)a);
    memcpy(w->joined + a, token_bytes(v, right), (size_t)b);
    int32_t merged = find(v, w->joined, a + b);
    if (merged < 0 || a == 0 || b == 0) return 0;
    uint64_t group = v->groups ? (uint64_t)v->groups[merged] : (uint64_t)merged;
    uint64_t cut = 0xFFFF - (uint64_t)chars_of(token_bytes(v, left), a);
    uint64_t tail = 0xFFFF - (uint64_t)chars_of(token_bytes(v, right), b);
    c->rank = (group << 32) | (cut << 16) | tail;
    c->place = (uint32_t)merged;
    c->merged = merged;
    return 1;
}

/* whether the candidate still applies to the symbols at its place (merging them gives its token) */
static int still_applies(const spmvocab *v, scratch *w, const candidate *c) {
    const symbol *s = w->symbols;
    if (!s[c->pos].alive || s[c->pos].next < 0) return 0;
    int32_t left = s[c->pos].id, right = s[s[c->pos].next].id;
    if (v->pair_keys) {
        candidate now;
        return merge_of(v, w, left, right, &now) && now.merged == c->merged;
    }
    int64_t a = token_len(v, left), b = token_len(v, right);
    return a + b == token_len(v, c->merged) && memcmp(token_bytes(v, c->merged), token_bytes(v, left), (size_t)a) == 0 &&
           memcmp(token_bytes(v, c->merged) + a, token_bytes(v, right), (size_t)b) == 0;
}

static int push_pair(const spmvocab *v, scratch *w, int32_t pos) {
    const symbol *s = w->symbols;
    int32_t next = s[pos].next;
    if (next < 0) return 1;
    candidate c;
    if (!merge_of(v, w, s[pos].id, s[next].id, &c)) return 1;
    c.pos = pos;
    return heap_push(w, c);
}

/* room for `need` symbols; 0 when memory runs out */
static int reserve(scratch *w, int64_t need) {
    if (need <= w->symbols_cap) return 1;
    int64_t cap = need > 2 * w->symbols_cap ? need : 2 * w->symbols_cap;
    symbol *grown = realloc(w->symbols, (size_t)cap * sizeof(symbol));
    if (!grown) return 0;
    w->symbols = grown;
    w->symbols_cap = cap;
    return 1;
}

static void add_symbol(scratch *w, int64_t *count, int32_t id) {
    symbol *s = &w->symbols[*count];
    s->id = id;
    s->prev = (int32_t)(*count - 1);
    s->next = -1;
    s->alive = 1;
    if (*count > 0) w->symbols[*count - 1].next = (int32_t)*count;
    (*count)++;
}

/* the length of the UTF-8 character starting at s[0] (of at most n bytes); a byte that starts none counts as one */
static inline int64_t char_len(const uint8_t *s, int64_t n) {
    uint8_t b = s[0];
    int64_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
    if (len > n) return 1;
    for (int64_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 1;
    return len;
}

/* one piece of text between added tokens: its symbols, merged, appended to ids; 0, or SPM_MEMORY / SPM_SHORT */
static int64_t encode_piece(const spmvocab *v, scratch *w, const uint8_t *text, int64_t n, int32_t *ids, int64_t cap,
                            int64_t *count, int64_t *spans) {
    if (n == 0) return 0;
    int64_t m = 0;
    int32_t unk = -1; /* an unknown run waiting to be added */
    for (int64_t i = v->space_prefix ? -1 : 0; i < n;) {
        const uint8_t *c = SPACE_MARK;
        int64_t len = 3;
        if (i < 0) { /* the space put before the piece */
            i = 0;
        } else {
            int64_t at = i;
            i += char_len(text + at, n - at);
            if (text[at] != ' ') c = text + at, len = i - at;
        }
        if (!reserve(w, m + 2 + len)) return SPM_MEMORY;
        int32_t id = find(v, c, len);
        if (id >= 0) {
            if (unk >= 0) add_symbol(w, &m, unk), unk = -1;
            add_symbol(w, &m, id);
            continue;
        }
        int bytes = 1;
        for (int64_t j = 0; j < len; j++) bytes &= v->byte_ids[c[j]] >= 0;
        if (bytes) { /* an unknown run waiting stays waiting, as the tokenizers library has it */
            for (int64_t j = 0; j < len; j++) add_symbol(w, &m, v->byte_ids[c[j]]);
            continue;
        }
        if (v->unk >= 0) unk = v->unk; /* fused with the unknown run before it, if any */
    }
    if (unk >= 0) add_symbol(w, &m, unk);

    w->heap_len = 0;
    for (int32_t pos = 0; pos + 1 < m; pos++)
        if (!push_pair(v, w, pos)) return SPM_MEMORY;
    symbol *s = w->symbols;
    while (w->heap_len > 0) {
        candidate top = heap_pop(w);
        if (!still_applies(v, w, &top)) continue;
        int32_t pos = top.pos, right = s[pos].next;
        s[pos].id = top.merged;
        s[pos].next = s[right].next;
        s[right].alive = 0;
        if (s[right].next >= 0) s[s[right].next].prev = pos;
        if (s[pos].prev >= 0 && !push_pair(v, w, s[pos].prev)) return SPM_MEMORY;
        if (!push_pair(v, w, pos)) return SPM_MEMORY;
    }
    for (int64_t i = 0; i < m; i++) {
        if (!s[i].alive) continue;
        if (*count >= cap) return SPM_SHORT;
        if (spans) spans[2 * *count] = spans[2 * *count + 1] = -1;
        ids[(*count)++] = s[i].id;
    }
    return 0;
}

/* the Unicode White_Space character at s[0] (of at most n bytes): its length in bytes, or 0 */
static int64_t white_space(const uint8_t *s, int64_t n) {
    uint8_t b = s[0];
    if (b == ' ' || (b >= 0x09 && b <= 0x0D)) return 1;
    int64_t len = char_len(s, n);
    uint32_t cp;
    if (len == 2 && b >= 0xC0) cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
    else if (len == 3) cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    else return 0;
    int space = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return space ? len : 0;
}

/* the longest added token that starts at text[0] (of at most n bytes): its id and length, or -1 */
static int32_t added_at(const spmvocab *v, const uint8_t *text, int64_t n, int64_t *len) {
    uint64_t lengths = (uint64_t)v->added_lengths[text[0]];
    if (!lengths) return -1;
    int64_t longest = v->added_max < n ? v->added_max : n;
    for (int64_t k = longest; k >= 1; k--) {
        if (k < 64 ? !((lengths >> (k - 1)) & 1) : !(lengths >> 63)) continue;
        int32_t id = find(v, text, k);
        if (id >= 0 && (v->kinds[id] & SPM_ADDED)) {
            *len = k;
            return id;
        }
    }
    return -1;
}

int64_t specwise_spm_encode(const spmvocab *v, const uint8_t *text, int64_t n, int32_t *ids, int64_t cap,
                            int64_t *spans) {
    if (!vocab_ok(v) || !v->table || n < 0 || (n > 0 && !text) || cap < 0 || (cap > 0 && !ids) ||
        n > INT32_MAX / 4)
        return SPM_BAD;
    scratch w = {0};
    if (!v->pair_keys && !(w.joined = malloc(2 * (size_t)v->longest + 1))) return SPM_MEMORY;
    int64_t count = 0, done = 0, status = 0;
    for (int64_t pos = 0; pos < n && status == 0;) {
        int64_t len = 0;
        int32_t id = added_at(v, text + pos, n - pos, &len);
        if (id < 0) {
            pos++;
            continue;
        }
        int64_t start = pos, stop = pos + len;
        if (v->kinds[id] & SPM_RSTRIP)
            for (int64_t k; stop < n && (k = white_space(text + stop, n - stop)) > 0;) stop += k;
        if (done < start) status = encode_piece(v, &w, text + done, start - done, ids, cap, &count, spans);
        if (status == 0) {
            if (count >= cap) {
                status = SPM_SHORT;
                break;
            }
            if (spans) spans[2 * count] = start, spans[2 * count + 1] = stop;
            ids[count++] = id;
            done = stop;
        }
        pos += len;
    }
    if (status == 0 && done < n) status = encode_piece(v, &w, text + done, n - done, ids, cap, &count, spans);
    free(w.symbols);
    free(w.heap);
    free(w.joined);
    return status < 0 ? status : count;
}

/* ---- decoding ----------------------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *out;
    int64_t cap, len;
    int strip; /* a leading space still to drop */
} writer;

static void put(writer *o, const uint8_t *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (o->strip) {
            o->strip = 0;
            if (s[i] == ' ') continue;
        }
        if (o->len < o->cap) o->out[o->len] = s[i];
        o->len++;
    }
}

static int hex_digit(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* the byte a token <0xXX> stands for (as Rust's u8::from_str_radix reads XX: two hex digits, or + and one), or -1 */
static int byte_token(const uint8_t *s, int64_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (s[3] == '+' && lo >= 0) return lo;
    return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

/* whether s[0 .. n) is UTF-8 as Rust's String::from_utf8 accepts it */
static int utf8_valid(const uint8_t *s, int64_t n) {
    for (int64_t i = 0; i < n;) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int64_t len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) len = 2;
        else if (b == 0xE0) len = 3, lo = 0xA0;
        else if (b >= 0xE1 && b <= 0xEC) len = 3;
        else if (b == 0xED) len = 3, hi = 0x9F;
        else if (b >= 0xEE && b <= 0xEF) len = 3;
        else if (b == 0xF0) len = 4, lo = 0x90;
        else if (b >= 0xF1 && b <= 0xF3) len = 4;
        else if (b == 0xF4) len = 4, hi = 0x8F;
        else return 0;
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int64_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

static void flush_bytes(writer *o, const uint8_t *run, int64_t n) {
    static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */
    if (utf8_valid(run, n)) {
        put(o, run, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) put(o, replacement, 3);
}

int64_t specwise_spm_decode(const spmvocab *v, const int64_t *ids, int64_t n, int skip_special, uint8_t *out,
                            int64_t cap) {
    if (!vocab_ok(v) || n < 0 || (n > 0 && !ids) || cap < 0 || (cap > 0 && !out)) return SPM_BAD;
    writer o = {out, cap, 0, v->space_prefix != 0};
    uint8_t fixed[64], *run = fixed; /* the bytes of a run of <0xXX> tokens */
    int64_t pending = 0, run_cap = sizeof fixed;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (id < 0 || id >= v->n) continue;
        if (skip_special && (v->kinds[id] & SPM_SPECIAL)) continue;
        const uint8_t *s = token_bytes(v, (int32_t)id);
        int64_t len = token_len(v, (int32_t)id);
        int byte = byte_token(s, len);
        if (byte >= 0) {
            if (pending == run_cap) {
                uint8_t *grown = malloc((size_t)(2 * run_cap));
                if (!grown) {
                    if (run != fixed) free(run);
                    return SPM_MEMORY;
                }
                memcpy(grown, run, (size_t)pending);
                if (run != fixed) free(run);
                run = grown;
                run_cap *= 2;
            }
            run[pending++] = (uint8_t)byte;
            continue;
        }
        if (pending) flush_bytes(&o, run, pending), pending = 0;
        for (int64_t k = 0; k < len;) {
            if (k + 3 <= len && memcmp(s + k, SPACE_MARK, 3) == 0) {
                put(&o, (const uint8_t *)" ", 1);
                k += 3;
            } else {
                put(&o, s + k, 1);
                k++;
            }
        }
    }
    if (pending) flush_bytes(&o, run, pending);
    if (run != fixed) free(run);
    return o.len;
}
