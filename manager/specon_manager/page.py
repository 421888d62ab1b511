"""The status page at ``GET /``: the ``Status`` a person reads in a browser, refreshing itself
(its workers from ``page_workers``, its job cards from ``page_jobs``, its migrations); and,
with a read token configured, the login form a browser gets instead until it logs in.

Every text from outside (ids, addresses, errors, the login message) is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from specon.wire.status import Status
from specon_manager import page_jobs, page_workers
from specon_manager.page_jobs import clock

REFRESH_SECONDS = 5

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.3rem;margin:0 0 .2rem} h2{font-size:1.05rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;font-size:.88rem}
td,th{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4} .muted{color:#777} .num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 .45rem;border-radius:.6rem;color:#fff;font-size:.8rem}
.bar{display:flex;height:.7rem;width:16rem;background:#eee;border-radius:.2rem;overflow:hidden}
.bar span{display:block;height:100%}
.logout{display:inline;margin:0} .logout button{font:inherit;font-size:.85rem}
.login label{display:block;margin:.8rem 0 .3rem} .login input{font:inherit;width:24rem;max-width:90%}
.login button{font:inherit;margin-top:.8rem} .error{color:#c62828;font-weight:600}
"""
# What the browser may do with these pages: styles inline, forms back to the manager only, no
# scripts, no framing (clickjacking of the login form), no referrer to other sites (but its
# own: with "no-referrer" a browser sends "Origin: null" on the form's POST).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}
# Pages list the workers, then the jobs, then the migrations: a person may start at each.
_SECTIONS = (
    ' · from the <a href="/">workers</a>, <a href="/?after=c:">jobs</a>, <a href="/?after=m:0">migrations</a>'
)
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
_LOGOUT_FORM = (
    f' · <form class="logout" method="post" action="{LOGOUT_PATH}">'
    '<button type="submit" id="logout">log out</button></form>'
)


def render_status_page(s: Status, *, logout: bool = False) -> str:
    """The page; ``logout``: with a log-out button (the reader came with a session cookie)."""
    rows_m = "".join(
        f"<tr><td>{escape(m.id)}</td><td>{escape(m.container)}</td>"
        f"<td>{escape(m.source)} &rarr; {escape(m.target)}</td>"
        f"<td>{escape(m.reason)}</td><td>{escape(m.state.value)}</td><td>{clock(m.decided_at)}</td>"
        f"<td class=num>{'' if m.downtime is None else f'{m.downtime:.2f}s'}</td>"
        f"<td class=muted>{escape(m.error or '')}</td></tr>"
        for m in reversed(s.migrations)
    )
    mode = f"mode {escape(s.mode)}" + (" · <b>dry-run</b>" if s.dry_run else "")
    more = f' · <a href="/?after={quote(s.next)}">next page</a>' if s.next is not None else ""
    more += _SECTIONS
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<title>specon manager</title><style>{_CSS}{page_workers.CSS}{page_jobs.CSS}</style></head><body>
<h1>specon manager</h1>
<div class="muted">{mode} · policy generation {s.policy_generation} · {clock(s.now)} UTC ·
refreshes every {REFRESH_SECONDS}s · <a href="/v1/status">JSON</a> ·
<a href="/metrics">metrics</a>{more}{_LOGOUT_FORM if logout else ""}</div>
{page_workers.render_workers(s)}
{page_jobs.render_jobs(s)}
<h2>Migrations ({len(s.migrations)} of {s.total_migrations})</h2>
<table><tr><th>id</th><th>container</th><th>move</th><th>reason</th><th>state</th><th>decided</th>
<th>downtime</th><th>error</th></tr>{rows_m}</table>
</body></html>
"""


def render_login_page(message: str | None = None) -> str:
    """The login form: the read token (or the shared one), POSTed to /login, never in a URL."""
    shown = f'<p class="error" id="message" role="alert">{escape(message)}</p>' if message else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specon manager: log in</title>
<style>{_CSS}</style></head><body>
<h1>specon manager</h1>
<div class="muted">The status page needs the manager's read token (or its shared token).</div>
{shown}<form class="login" method="post" action="{LOGIN_PATH}">
<label for="token">Token</label>
<input type="password" id="token" name="token" autocomplete="current-password" required autofocus>
<br><button type="submit" id="login">Log in</button>
</form>
</body></html>
"""
