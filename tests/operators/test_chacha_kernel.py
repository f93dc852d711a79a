"""The compiled ChaCha20 (operators/_chacha_kernel.py) makes exactly the keystream of the ``cryptography`` package
(OpenSSL), so that every draw of noise is the same whichever of the two made it: the RFC's test vector, thousands
of random keys, counters, domains and addresses (up to their limits), and the generator's words either way."""

from __future__ import annotations

import numpy as np

from operators import noise
from operators._chacha_kernel import keystream
from operators.noise import KeyedGenerator, _keystream


def test_the_rfc_8439_block() -> None:
    """RFC 8439, 2.3.2: key 00..1f, nonce 00 00 00 09 00 00 00 4a 00 00 00 00, block counter 1."""
    kw = np.arange(32, dtype=np.uint8).view("<u4").astype(np.uint64)
    nonce = np.frombuffer(bytes.fromhex("000000090000004a00000000"), dtype="<u4")
    out = keystream(kw, 1, int(nonce[0]), int(nonce[1]), int(nonce[2]), 1).astype("<u8").tobytes()
    assert out.hex().startswith("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e")
    assert out.hex().endswith("d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")


def test_the_compiled_keystream_is_openssls() -> None:
    rng = np.random.default_rng(20261126)
    for trial in range(3000):
        key = rng.bytes(32)
        nblocks = int(rng.integers(1, 17 if trial % 2 else 80))  # around the generator's threshold (64) too
        top = (1 << 32) - nblocks
        block0 = [0, top, int(rng.integers(0, top + 1))][trial % 3]
        domain = [0, (1 << 32) - 2, int(rng.integers(0, 1 << 32))][trial % 3]
        address = [0, (1 << 64) - 1, int(rng.integers(0, 1 << 63)) * 2 + int(rng.integers(0, 2))][(trial // 3) % 3]
        want = np.frombuffer(_keystream(key, block0, domain, address, nblocks), dtype="<u8")
        kw = np.frombuffer(key, dtype="<u4").astype(np.uint64)
        got = keystream(kw, block0, domain, address & 0xFFFFFFFF, address >> 32, nblocks)
        assert np.array_equal(want, got), trial


def test_the_generator_draws_the_same_words_either_way(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    gen = KeyedGenerator(rng.bytes(32))
    cases = [(int(rng.integers(0, 9)), int(rng.integers(0, 1 << 40)), int(rng.integers(0, 300)),
              int(rng.integers(1, 700))) for _ in range(500)]  # up to 88 blocks: both sides of the threshold
    monkeypatch.setitem(noise._kernel_state, "chacha", None)
    before = [gen.words(*c) for c in cases]
    monkeypatch.setitem(noise._kernel_state, "chacha", keystream)
    after = [gen.words(*c) for c in cases]
    assert all(np.array_equal(a, b) and a.dtype == b.dtype == np.uint64 for a, b in zip(before, after, strict=True))


def test_openssls_context_made_directly_is_the_public_one() -> None:
    """``_keystream`` builds OpenSSL's ChaCha20 context without the public wrapper's repeated checks (15 of its 20
    us a call) where this ``cryptography`` allows it: it must be taken here, and give the public path's bytes on the
    RFC's vector and on random keys, counters and addresses; a build of it that differs is refused at import."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    assert noise._encryptor is not noise._public_encryptor  # the direct context, on this cryptography
    rfc = bytes.fromhex("01000000000000090000004a00000000")
    want = Cipher(algorithms.ChaCha20(bytes(range(32)), rfc), mode=None).encryptor().update(bytes(64))
    assert noise._encryptor(bytes(range(32)), rfc).update(bytes(64)) == want
    assert want.hex().startswith("10f1e7e4d13b5915500fdd1fa32071c4")
    rng = np.random.default_rng(11)
    for _ in range(500):
        key, nonce, n = rng.bytes(32), rng.bytes(16), int(rng.integers(1, 700)) * 64
        assert noise._encryptor(key, nonce).update(bytes(n)) == noise._public_encryptor(key, nonce).update(bytes(n))
