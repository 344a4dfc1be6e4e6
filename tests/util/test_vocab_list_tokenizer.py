"""Vocabulary-list tokenizers (byte strings matched greedily, longest first) and `package:<pkg>/<file>` specs: a
fabricated vocabulary, the one-line errors, and the RWKV world vocabulary against the `rwkv` package's own trie
tokenizer where that package is installed."""

import pytest

from recurlen.util.errors import UserError
from recurlen.util.tokenizers import VocabListTokenizer, load_tokenizer, package_file


def write_vocab(path, extra=(), skip_bytes=()):
    lines = [f"{b + 1} {bytes([b])!r} 1" for b in range(256) if b not in skip_bytes]
    lines += [f"{300 + i} {tok!r} {len(tok.encode('utf-8') if isinstance(tok, str) else tok)}"
              for i, tok in enumerate(extra)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_greedy_longest_match_round_trips(tmp_path):
    tok = load_tokenizer(str(write_vocab(tmp_path / "v.txt", extra=["ab", "abc", "bc", "é", "héllo"])))
    assert isinstance(tok, VocabListTokenizer) and tok.eos_id == 0 and tok.vocab_size == 305
    assert tok.encode("abcbc") == [301, 302]  # 'abc' beats 'ab', then 'bc'
    assert tok.encode("héllo wörld") == [304, 33, *tok.encode("w"), *[b + 1 for b in "ö".encode()], 115, 109, 101]
    for text in ("abcbc", "héllo wörld", "", "\x00\n\t🦊"):
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch(["ab", "c"]) == [[300], [100]]


@pytest.mark.parametrize("content,match", [
    ("0 'a' 1\n", "must leave id 0"),
    ("1 'ab' 3\n", r"v.txt:1 is not `<id> <literal> <length>`"),
    ("x 'a' 1\n", r"v.txt:1 is not"),
])
def test_malformed_vocabularies_name_the_problem(tmp_path, content, match):
    (tmp_path / "v.txt").write_text(content)
    with pytest.raises(UserError, match=match):
        VocabListTokenizer(tmp_path / "v.txt")


def test_a_vocabulary_missing_bytes_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"bytes \[7\] have no id"):
        VocabListTokenizer(write_vocab(tmp_path / "v.txt", skip_bytes=(7,)))


def test_package_spec_finds_a_shipped_file_without_importing(tmp_path, monkeypatch):
    pkg = tmp_path / "somepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    write_vocab(pkg / "vocab.txt", extra=["xyz"])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_file("package:somepkg/vocab.txt") == pkg / "vocab.txt"
    assert load_tokenizer("package:somepkg/vocab.txt").encode("xyz") == [300]
    with pytest.raises(UserError, match="the package 'somepkg' has no file 'other.txt'"):
        package_file("package:somepkg/other.txt")
    with pytest.raises(UserError, match="no installed Python package 'nosuchpkg_xyz'"):
        load_tokenizer("package:nosuchpkg_xyz/vocab.txt")


def test_world_vocabulary_matches_the_rwkv_package_tokenizer():
    trie = pytest.importorskip("rwkv.rwkv_tokenizer")
    path = package_file("package:rwkv/rwkv_vocab_v20230424.txt")
    ours, theirs = load_tokenizer("package:rwkv/rwkv_vocab_v20230424.txt"), trie.TRIE_TOKENIZER(str(path))
    assert (ours.vocab_size, ours.eos_id) == (65530, 0)
    text = "Hello world! 你好，世界。\n\n  def f(x):\n\treturn x ** 2  # 🦊 " * 3
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == text
