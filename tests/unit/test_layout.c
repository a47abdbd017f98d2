/* Layout names, validation and the layers of each pipeline stage / virtual chunk. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "tap.h"

static CkptfsModel model_of(uint64_t layers, uint64_t heads, uint64_t kv_heads, uint64_t ffn)
{
    CkptfsModel m = {.layers = layers, .hidden = heads * 128, .heads = heads, .kv_heads = kv_heads,
                     .head_dim = 128, .ffn = ffn, .vocab = 32000};
    return m;
}

static void test_parse(void)
{
    const CkptfsLayout base = {.tp = 2, .pp = 4, .vpp = 1};
    CkptfsLayout l;
    const struct {
        const char *name;
        bool ok;
        unsigned tp, pp, vpp;
    } cases[] = {
        {"tp4pp1", true, 4, 1, 1},   {"tp2", true, 2, 1, 1},       {"tp2pp2vpp2", true, 2, 2, 2},
        {"vpp2", true, 2, 4, 2},     {"pp2", true, 2, 2, 1},       {"tp8pp1vpp1", true, 8, 1, 1},
        {"tp0pp1", false, 0, 0, 0},  {"tp2pp", false, 0, 0, 0},    {"hf", false, 0, 0, 0},
        {"tp2pp2x", false, 0, 0, 0}, {"pp2tp2", false, 0, 0, 0},   {"", false, 0, 0, 0},
        {"tp02", false, 0, 0, 0},    {"tp99999", false, 0, 0, 0},  {"vpp2pp2", false, 0, 0, 0},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        bool ok = ckptfs_layout_parse(cases[i].name, &base, &l);
        if (cases[i].ok)
            tap_ok(ok && l.tp == cases[i].tp && l.pp == cases[i].pp && l.vpp == cases[i].vpp,
                   "'%s' parses as tp%u pp%u vpp%u", cases[i].name, cases[i].tp, cases[i].pp,
                   cases[i].vpp);
        else
            tap_ok(!ok, "'%s' is not a layout name", cases[i].name);
    }
    CkptfsLayout v = {.tp = 2, .pp = 2, .vpp = 2};
    g_autofree char *name = ckptfs_layout_name(&v);
    tap_ok(strcmp(name, "tp2pp2vpp2") == 0, "canonical name tp2pp2vpp2");
    v.vpp = 1;
    g_autofree char *name1 = ckptfs_layout_name(&v);
    tap_ok(strcmp(name1, "tp2pp2") == 0, "canonical name without vpp 1");
}

static void expect_valid(const CkptfsModel *m, CkptfsLayout l, bool want, const char *what)
{
    GError *error = NULL;
    bool ok = ckptfs_layout_validate(&l, m, &error);
    tap_ok(ok == want, "%s: %s%s%s", what, want ? "valid" : "invalid", error ? " - " : "",
           error ? error->message : "");
    g_clear_error(&error);
}

static void test_validate(void)
{
    CkptfsModel m = model_of(32, 32, 8, 14336); /* Llama-3-8B-like */
    expect_valid(&m, (CkptfsLayout){.tp = 8, .pp = 1, .vpp = 1}, true, "tp8 with 8 groups");
    expect_valid(&m, (CkptfsLayout){.tp = 3, .pp = 1, .vpp = 1}, false, "tp3 with 8 KV heads");
    /* tp above the query groups: the fused q/k/v rows must still split evenly. */
    CkptfsModel mqa = model_of(2, 8, 1, 64);
    mqa.head_dim = 6;
    expect_valid(&mqa, (CkptfsLayout){.tp = 8, .pp = 1, .vpp = 1}, false, "tp8, 1 query group, 60 q/k/v rows");
    expect_valid(&mqa, (CkptfsLayout){.tp = 4, .pp = 1, .vpp = 1}, true, "tp4, 1 query group, 60 q/k/v rows");
    mqa.head_dim = 8;
    expect_valid(&mqa, (CkptfsLayout){.tp = 8, .pp = 1, .vpp = 1}, true, "tp8, 1 query group, 80 q/k/v rows");
    expect_valid(&m, (CkptfsLayout){.tp = 16, .pp = 1, .vpp = 1}, true,
                 "tp16 > 8 groups (QKV sub-sharding, mcore >= 0.16)");
    expect_valid(&m, (CkptfsLayout){.tp = 64, .pp = 1, .vpp = 1}, false, "tp64 > 32 heads");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 3, .vpp = 1}, false, "pp3 with 32 layers");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 4, .vpp = 2}, true, "pp4 vpp2");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 4, .vpp = 3}, false, "pp4 vpp3");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 1, .vpp = 2}, false, "vpp without pp");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 3, .vpp = 1, .pp_first = 10, .pp_last = 10},
                 true, "pp3 first 10 last 10, 12 on the middle stage");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 4, .vpp = 1, .pp_first = 10, .pp_last = 9},
                 false, "pp4 first 10 last 9: 13 middle layers over 2 stages");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 3, .vpp = 1, .pp_first = 8, .pp_last = 8},
                 true, "pp3 first 8 last 8, 16 in the middle");
    expect_valid(&m, (CkptfsLayout){.tp = 1, .pp = 64, .vpp = 1}, false, "pp64 > 32 layers");
    CkptfsModel odd_ffn = model_of(4, 8, 8, 100);
    expect_valid(&odd_ffn, (CkptfsLayout){.tp = 8, .pp = 1, .vpp = 1}, false,
                 "tp8 with ffn 100");
}

/* Reference from DESIGN 4 and Megatron's get_transformer_layer_offset, written out by hand. */
static void test_chunks(void)
{
    CkptfsModel m = model_of(32, 32, 8, 14336);
    CkptfsLayout l = {.tp = 1, .pp = 4, .vpp = 2};
    uint64_t first, count;
    ckptfs_layout_chunk_layers(&l, &m, 0, 1, &first, &count);
    tap_ok(first == 16 && count == 4, "32 layers pp4 vpp2: stage 0 chunk 1 holds 16-19");
    ckptfs_layout_chunk_layers(&l, &m, 3, 0, &first, &count);
    tap_ok(first == 12 && count == 4, "stage 3 chunk 0 holds 12-15");

    CkptfsModel m10 = model_of(10, 8, 8, 64);
    CkptfsLayout u = {.tp = 1, .pp = 4, .vpp = 1, .pp_first = 1, .pp_last = 3};
    const uint64_t want_first[] = {0, 1, 4, 7}, want_count[] = {1, 3, 3, 3};
    int ok = 0;
    for (unsigned p = 0; p < 4; p++) {
        ckptfs_layout_chunk_layers(&u, &m10, p, 0, &first, &count);
        ok += first == want_first[p] && count == want_count[p];
    }
    tap_ok(ok == 4, "10 layers pp4 first 1 last 3: 0 | 1-3 | 4-6 | 7-9");

    /* Uneven with vpp: 12 layers, pp3, first 2, last 2, vpp 2 -> round of 6:
     * stage0: [0,1) [6,7); stage1: [1,5)... no: middle 8 layers / (2 chunks) = 4 per chunk. */
    CkptfsModel m12 = model_of(12, 8, 8, 64);
    CkptfsLayout uv = {.tp = 1, .pp = 3, .vpp = 2, .pp_first = 2, .pp_last = 2};
    const uint64_t uv_first[3][2] = {{0, 6}, {1, 7}, {5, 11}}, uv_count[3][2] = {{1, 1}, {4, 4}, {1, 1}};
    ok = 0;
    for (unsigned p = 0; p < 3; p++)
        for (unsigned v = 0; v < 2; v++) {
            ckptfs_layout_chunk_layers(&uv, &m12, p, v, &first, &count);
            ok += first == uv_first[p][v] && count == uv_count[p][v];
        }
    tap_ok(ok == 6, "12 layers pp3 vpp2 first 2 last 2 follows Megatron's offsets");

    /* Every valid layout's chunks tile the layers exactly once. */
    int layouts = 0, tiled = 0;
    for (unsigned pp = 1; pp <= 8; pp++)
        for (unsigned vpp = 1; vpp <= 4; vpp++)
            for (unsigned f = 0; f <= 6; f += 2)
                for (unsigned la = 0; la <= 6; la += 3) {
                    CkptfsLayout t = {.tp = 1, .pp = pp, .vpp = vpp, .pp_first = f, .pp_last = la};
                    if (!ckptfs_layout_validate(&t, &m, NULL))
                        continue;
                    layouts++;
                    uint8_t seen[32] = {0};
                    bool good = true;
                    for (unsigned p = 0; p < pp; p++)
                        for (unsigned v = 0; v < vpp; v++) {
                            ckptfs_layout_chunk_layers(&t, &m, p, v, &first, &count);
                            for (uint64_t i = first; i < first + count; i++)
                                good &= i < 32 && seen[i]++ == 0;
                        }
                    for (int i = 0; i < 32; i++)
                        good &= seen[i] == 1;
                    tiled += good;
                }
    tap_ok(layouts > 20 && tiled == layouts, "chunks of %d valid layouts tile the 32 layers", layouts);
    tap_is_u64(ckptfs_padded_vocab(250, 128, 2), 256, "vocab 250 padded for tp2");
    tap_is_u64(ckptfs_padded_vocab(32000, 128, 8), 32768, "vocab 32000 padded for tp8");
    tap_is_u64(ckptfs_padded_vocab(128256, 128, 1), 128256, "vocab 128256 is already a multiple");
}

/* Expert parallelism: names, validation against the experts, and the files Megatron writes. */
static void test_expert_layouts(void)
{
    const CkptfsLayout base = {.tp = 2, .pp = 2, .vpp = 1, .ep = 4};
    CkptfsLayout l;
    tap_ok(ckptfs_layout_parse("tp4pp1ep8etp1", &base, &l) && l.tp == 4 && l.pp == 1 &&
               ckptfs_layout_ep(&l) == 8 && ckptfs_layout_etp(&l) == 1,
           "tp4pp1ep8etp1: tp 4, ep 8, etp 1");
    tap_ok(ckptfs_layout_parse("tp2", &base, &l) && ckptfs_layout_ep(&l) == 1 && ckptfs_layout_etp(&l) == 2,
           "a named tp starts without expert parallelism (etp follows tp)");
    tap_ok(ckptfs_layout_parse("vpp2", &base, &l) && ckptfs_layout_ep(&l) == 4 && l.vpp == 2,
           "vpp2 keeps the base's ep");
    tap_ok(ckptfs_layout_parse("tp1pp4vpp2ep2", &base, &l) && l.pp == 4 && l.vpp == 2 && ckptfs_layout_ep(&l) == 2,
           "tp1pp4vpp2ep2 parses");
    tap_ok(!ckptfs_layout_parse("tp2ep2pp2", &base, &l) && !ckptfs_layout_parse("tp2etp1ep2", &base, &l) &&
               !ckptfs_layout_parse("tp2ep0", &base, &l),
           "ep after pp, etp after ep; no ep0");
    CkptfsLayout named = {.tp = 4, .pp = 1, .vpp = 1, .ep = 8, .etp = 1};
    g_autofree char *n1 = ckptfs_layout_name(&named);
    CkptfsLayout same_etp = {.tp = 2, .pp = 2, .vpp = 2, .ep = 2, .etp = 2};
    g_autofree char *n2 = ckptfs_layout_name(&same_etp);
    tap_ok(strcmp(n1, "tp4pp1ep8etp1") == 0 && strcmp(n2, "tp2pp2vpp2ep2") == 0,
           "canonical names: etp only when it differs from tp (%s, %s)", n1, n2);

    CkptfsModel m = model_of(4, 8, 2, 96);
    m.experts = 4, m.moe_ffn = 32, m.topk = 2;
    CkptfsLayout ep8 = {.tp = 1, .pp = 1, .vpp = 1, .ep = 8};
    CkptfsLayout etp3 = {.tp = 1, .pp = 1, .vpp = 1, .ep = 2, .etp = 3};
    CkptfsLayout ok = {.tp = 2, .pp = 2, .vpp = 1, .ep = 4, .etp = 1};
    expect_valid(&m, ep8, false, "ep 8 does not divide 4 experts");
    expect_valid(&m, etp3, false, "etp 3 does not divide the expert ffn 32");
    expect_valid(&m, ok, true, "tp2pp2ep4etp1 is valid for 4 experts");
    CkptfsModel dense = model_of(4, 8, 2, 96);
    CkptfsLayout dense_ep = {.tp = 1, .pp = 1, .vpp = 1, .ep = 2};
    expect_valid(&dense, dense_ep, false, "ep on a dense model");

    /* Megatron's writers: dense DP rank 0 or expert DP rank 0, one file per (TP rank, EP rank). */
    const struct {
        CkptfsLayout layout;
        const char *files;
    } grids[] = {
        {{.tp = 1, .pp = 1, .vpp = 1, .ep = 2}, "00_000/0 00_001/0"},
        {{.tp = 2, .pp = 1, .vpp = 1, .ep = 2}, "00_000/0 01_000/1 00_001/0 01_001/1"},
        {{.tp = 2, .pp = 1, .vpp = 1, .ep = 2, .etp = 1}, "00_000/0 01_001/0"},
        {{.tp = 4, .pp = 1, .vpp = 1, .ep = 2, .etp = 1}, "00_000/0 01_001/0 02_000/0 03_001/0"},
        {{.tp = 2, .pp = 1, .vpp = 1, .ep = 4, .etp = 1}, "00_000/0 01_001/0 00_002/0 01_003/0"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(grids); i++) {
        g_autoptr(GArray) files = ckptfs_layout_rank_files(&grids[i].layout);
        GString *got = g_string_new(NULL);
        for (guint f = 0; f < files->len; f++) {
            const CkptfsRankFile *r = &g_array_index(files, CkptfsRankFile, f);
            g_string_append_printf(got, "%s%02u_%03u/%u", f ? " " : "", r->tp, r->ep, r->etp);
        }
        g_autofree char *name = ckptfs_layout_name(&grids[i].layout);
        tap_ok(strcmp(got->str, grids[i].files) == 0, "%s writes %s (got %s)", name, grids[i].files, got->str);
        g_string_free(got, TRUE);
    }
    CkptfsLayout etp_over_tp = {.tp = 1, .pp = 1, .vpp = 1, .ep = 2, .etp = 2};
    expect_valid(&m, etp_over_tp, false, "tp1 ep2 etp2: two expert shards would share a file name");
    /* Where tp and etp x ep do not divide one another, a loading world of their lcm has ranks
     * whose file (named by TP and EP rank) no rank writes, or holds another expert shard. */
    CkptfsModel six = model_of(4, 12, 12, 96);
    six.experts = 6, six.moe_ffn = 48, six.topk = 2;
    const struct {
        CkptfsLayout layout;
        bool valid;
        const char *why;
    } worlds[] = {
        {{.tp = 4, .pp = 1, .vpp = 1, .etp = 3}, false, "tp4 etp3: ranks 4-11 need other shards of the files"},
        {{.tp = 2, .pp = 1, .vpp = 1, .ep = 3, .etp = 1}, false, "tp2 ep3 etp1: ranks 3-5 need 3 more files"},
        {{.tp = 4, .pp = 1, .vpp = 1, .ep = 3, .etp = 2}, false, "tp4 ep3 etp2: a world of 12"},
        {{.tp = 6, .pp = 1, .vpp = 1, .ep = 3, .etp = 2}, true, "tp6 ep3 etp2: one grid of 6"},
        {{.tp = 6, .pp = 1, .vpp = 1, .ep = 3, .etp = 1}, true, "tp6 ep3 etp1: ep x etp divides tp"},
        {{.tp = 2, .pp = 1, .vpp = 1, .ep = 6, .etp = 1}, true, "tp2 ep6 etp1: tp divides ep x etp"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(worlds); i++) {
        GError *error = NULL;
        bool served = ckptfs_layout_validate(&worlds[i].layout, &six, &error) &&
                  ckptfs_layout_loadable(&worlds[i].layout, &error);
        tap_ok(served == worlds[i].valid, "%s: %s%s%s", worlds[i].why, served ? "loadable" : "refused",
               error ? " - " : "", error ? error->message : "");
        g_clear_error(&error);
    }
    /* As a source, a file set Megatron writes for tp2 ep3 etp1 is read: it holds every shard. */
    expect_valid(&six, worlds[1].layout, true, "tp2 ep3 etp1 as a saved layout");

    CkptfsLayout both = {.tp = 2, .pp = 4, .vpp = 1, .ep = 2};
    CkptfsRankFile f = {1, 1, 1};
    g_autofree char *dir = ckptfs_rank_file_dir(&both, 3, &f);
    tap_ok(strcmp(dir, "mp_rank_01_003_001") == 0, "pp and ep: mp_rank_TT_PPP_EEE (%s)", dir);
}

int main(void)
{
    test_parse();
    test_validate();
    test_chunks();
    test_expert_layouts();
    return tap_done();
}
