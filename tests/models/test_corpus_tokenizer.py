import json

from ddtree.models.corpus import (
    corpus_manifest,
    list_stdlib_files,
    load_corpus,
    make_prompts,
    split_of,
)
from ddtree.models.tokenizer import EOS_TOKEN, MASK_TOKEN, save_tokenizer, special_token_ids, train_bpe


def test_file_listing_excludes_tests_and_site_packages():
    files = list_stdlib_files()
    assert files == sorted(files) and len(files) > 100
    for f in files:
        parts = f.split("/")[:-1]
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts), f
    assert "os.py" in files


def test_split_is_a_pure_function_of_the_path():
    assert split_of("os.py") == split_of("os.py")
    files = list_stdlib_files()
    held = [f for f in files if split_of(f) == "heldout"]
    assert 0.01 < len(held) / len(files) < 0.12  # about 5% held out


def test_corpus_manifest_and_prompts_are_deterministic():
    a = load_corpus(max_train_bytes=50_000)
    b = load_corpus(max_train_bytes=50_000)
    ma, mb = corpus_manifest(a), corpus_manifest(b)
    assert ma["corpus_sha256"] == mb["corpus_sha256"] and ma["num_heldout"] > 0
    pa, pb = make_prompts(a, n=20, seed=3), make_prompts(b, n=20, seed=3)
    assert pa == pb and len({p["text"] for p in pa}) == 20
    held = {f.relpath: f.text for f in a if f.split == "heldout"}
    for p in pa:
        assert p["dataset"] == "stdlib-heldout" and p["text"].endswith("\n")
        assert p["text"] in held[p["source"]]  # cut from a held-out file at line boundaries
        assert 2 <= p["text"].count("\n") <= 12
    assert make_prompts(a, n=20, seed=4) != pa


def test_tokenizer_round_trip_and_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    texts = [f.text for f in load_corpus(max_train_bytes=100_000) if f.split == "train"]
    tok = train_bpe(texts, 400)
    ids = special_token_ids(tok)
    assert ids == {"eos_token_id": 0, "mask_token_id": 1}
    save_tokenizer(tok, tmp_path, 512)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    src = "def f(x):\n    return x  # é ✓\n"
    enc = hf(src).input_ids
    assert hf.decode(enc) == src
    assert hf.eos_token == EOS_TOKEN and hf.mask_token == MASK_TOKEN and hf.pad_token_id == 0
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 512
