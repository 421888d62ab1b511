"""StaticTokens: each token proves its own identity and nothing else, however many there are."""

from __future__ import annotations

import secrets

import pytest
from specon_manager.auth import READER, SHARED, Identity, StaticTokens


def agents(n: int) -> dict[str, str]:
    return {f"w{i}": secrets.token_urlsafe(24) for i in range(n)}


async def test_every_token_proves_its_own_identity() -> None:
    tokens = agents(2_000)
    shared, read = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    auth = StaticTokens(agents=tokens, shared=shared, read=read)
    for worker, token in tokens.items():
        assert await auth.authenticate(token) == Identity(f"agent:{worker}", worker)  # type: ignore[arg-type]
    assert await auth.authenticate(shared) == Identity(SHARED)
    assert await auth.authenticate(read) == Identity(READER, agent=False)


@pytest.mark.parametrize(
    "given",
    ["", "x", "w0", "agent:w0", "\udcff", "é" * 40],
)
async def test_anything_else_proves_nothing(given: str) -> None:
    auth = StaticTokens(agents=agents(50), shared=secrets.token_urlsafe(24))
    assert await auth.authenticate(given) is None


async def test_a_near_miss_proves_nothing() -> None:
    tokens = agents(10)
    auth = StaticTokens(agents=tokens)
    token = tokens["w3"]
    for wrong in (token[:-1], token + "a", token.upper(), " " + token, token[:-1] + chr(ord(token[-1]) ^ 1)):
        assert await auth.authenticate(wrong) is None


def test_a_reused_token_is_refused() -> None:
    token = secrets.token_urlsafe(24)
    with pytest.raises(ValueError, match="reuses the token of agent:a"):
        StaticTokens(agents={"a": token}, shared=token)


def test_no_tokens_is_falsy() -> None:
    assert not StaticTokens()
    assert StaticTokens(read=secrets.token_urlsafe(24))
