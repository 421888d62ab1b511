"""``specon.daemon.manager_url``: which manager URLs an agent may send its token to."""

from __future__ import annotations

import re

import pytest

from specon.daemon.manager_url import InsecureURLError, check_manager_url, is_loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("198.51.100.9", False),
        ("10.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:127.0.0.1", False),  # mapped: not taken on trust
        ("specon-manager", False),
        ("localhost.example", False),
        ("127.0.0.1.example", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:7700", "http://127.0.0.9:1/", "http://[::1]:7700", "http://localhost:7700"],
)
def test_plain_http_on_loopback_is_allowed(url: str) -> None:
    assert check_manager_url(url) == "http"


@pytest.mark.parametrize(
    "url",
    [
        "https://198.51.100.2:7700",
        "https://specon-manager:7700",
        "https://127.0.0.1:7700",
        "https://[2001:db8::1]",
    ],
)
def test_https_is_allowed_anywhere(url: str) -> None:
    assert check_manager_url(url) == "https"


@pytest.mark.parametrize(
    "url",
    ["http://198.51.100.9:7700", "http://specon-manager:7700", "http://0.0.0.0:7700", "HTTP://10.1.2.3"],
)
def test_plain_http_off_loopback_is_refused_unless_insecure_http(url: str) -> None:
    with pytest.raises(InsecureURLError) as err:
        check_manager_url(url)
    message = str(err.value)
    assert message.startswith(f"refusing to send the bearer token in clear text to {url}")
    assert "--insecure-http" in message and "https://" in message and "\n" not in message
    assert check_manager_url(url, insecure_http=True) == "http"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://127.0.0.1", "must be http(s)://HOST[:PORT]"),
        ("127.0.0.1:7700", "must be http(s)://HOST[:PORT]"),
        ("https://", "must be http(s)://HOST[:PORT]"),
        ("http://127.0.0.1:99999", "not a valid URL"),
        ("http://[::1", "not a valid URL"),
        ("https://user:pw@198.51.100.2", "no user name or password"),
    ],
)
def test_an_unusable_url_says_why(url: str, says: str) -> None:
    with pytest.raises(InsecureURLError, match=re.escape(says)):
        check_manager_url(url, insecure_http=True)
