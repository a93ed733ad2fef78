/*
 * word_count: Phoenix word_count's `use_len`, a packed array of one int per thread.
 *
 * Each thread tokenizes its slice of a text and counts the words in its own hash table (no
 * sharing there), and counts the characters it has consumed in its slot of the global
 * `use_len` (Phoenix's use_len has the same packed layout). The slots are 4 bytes apart, so
 * all threads write one cache line on every character. The loop reads the text through
 * `char`, which may alias anything, so gcc keeps use_len in memory even without volatile
 * (checked: gcc 12 -O2); it is volatile anyway so that stays true under any
 * optimizer.
 *
 * FIXED: each use_len slot aligned and padded to FIX_ALIGN bytes.
 * SIZE: passes over each thread's 1 MiB of text.
 */
#include "common.h"

#define TEXT_PER_THREAD (1L << 20)
#define DICT_WORDS 2048
#define TABLE_SIZE 8192 /* power of two, > DICT_WORDS */

#ifdef FIXED
static struct {
    volatile int n;
} __attribute__((aligned(FIX_ALIGN))) use_len[MAX_THREADS];
#define USE_LEN(t) use_len[t].n
#else
static volatile int use_len[MAX_THREADS];
#define USE_LEN(t) use_len[t]
#endif

struct word_entry {
    uint64_t key;
    int count;
};

struct wc_thread {
    const char *text;
    long len;
    struct word_entry *table;
};

static long passes;

static void add_word(struct word_entry *table, uint64_t key)
{
    unsigned long h = (unsigned long)(key & (TABLE_SIZE - 1));
    while (table[h].count && table[h].key != key)
        h = (h + 1) & (TABLE_SIZE - 1);
    table[h].key = key;
    table[h].count++;
}

static NOINLINE void word_count_map(struct wc_thread *w, int t)
{
    for (long p = 0; p < passes; p++) {
        long i = 0;
        while (i < w->len) {
            while (i < w->len && w->text[i] == ' ')
                i++;
            if (i >= w->len)
                break;
            uint64_t key = 1469598103934665603ULL; /* FNV-1a */
            while (i < w->len && w->text[i] != ' ') {
                key = (key ^ (unsigned char)w->text[i]) * 1099511628211ULL;
                i++;
                USE_LEN(t)++; /* LASER-EXPECT: false_sharing use_len */
            }
            add_word(w->table, key);
        }
    }
}

static struct wc_thread work[MAX_THREADS];

static void *wc_thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    word_count_map(&work[t], t);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 200, MAX_THREADS);
    passes = a.size;

    /* A dictionary of made-up words, then a text drawing from it. */
    static char dict[DICT_WORDS][12];
    for (int d = 0; d < DICT_WORDS; d++) {
        uint64_t r = mix64((uint64_t)d + 1000);
        int n = 2 + (int)(r % 9);
        for (int k = 0; k < n; k++)
            dict[d][k] = (char)('a' + (r >> (8 + 2 * k)) % 26);
        dict[d][n] = 0;
    }
    long total = TEXT_PER_THREAD * a.threads;
    char *text = xmalloc((size_t)total);
    long pos = 0;
    for (uint64_t w = 0; pos < total; w++) {
        const char *word = dict[mix64(w) % DICT_WORDS];
        for (; *word && pos < total; word++)
            text[pos++] = *word;
        if (pos < total)
            text[pos++] = ' ';
    }
    /* Each thread's slice, cut at spaces so no word is split between threads. */
    long start = 0;
    for (int t = 0; t < a.threads; t++) {
        long end = t == a.threads - 1 ? total : TEXT_PER_THREAD * (t + 1);
        while (end < total && text[end] != ' ')
            end++;
        work[t].text = text + start;
        work[t].len = end - start;
        work[t].table = calloc(TABLE_SIZE, sizeof(struct word_entry));
        start = end;
    }

    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, wc_thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);

    /* Order-independent merge: a word's hash weighted by its count, summed. */
    uint64_t sum = 0, chars = 0;
    for (int t = 0; t < a.threads; t++) {
        chars += (uint64_t)USE_LEN(t);
        for (int h = 0; h < TABLE_SIZE; h++)
            if (work[t].table[h].count)
                sum += mix64(work[t].table[h].key) * (uint64_t)work[t].table[h].count;
        free(work[t].table);
    }
    print_checksum(mix64(sum) ^ chars);
    free(text);
    return 0;
}
