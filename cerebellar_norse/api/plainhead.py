"""One whole, plainly written request to a given route read in a single pass, without the HTTP parser's callbacks.

The protocol (:func:`.protocol.guarded_protocol`) feeds every read to httptools, whose parser calls back into Python
for the request's start, its target, each header, the end of its head, its body and its end, and uvicorn builds the
request's scope and cycle from those calls; per tick request that Python cost more than the tick's own route
(docs/http.md, "Reading a plain tick request in one pass"). :func:`read_plain_request` takes a read that holds
exactly one request written the plainest way (``POST <target> HTTP/1.1``, header fields of visible ASCII each on its
own CRLF line, one ``Host``, one ``Content-Length`` whose body is the rest of the read, nothing that changes the
framing or the connection) and returns its header fields as the parser would have given them.

Whatever it returns, httptools would have read the same way; anything it is not sure of (a field it does not
read, a byte outside the plain alphabet, a second request or a partial one, an unusual ``Connection``) is left to
the parser (it returns None), which reads or refuses it as before. So this reader can only make the service faster,
never change an answer: a test sends the same requests both ways and compares.
"""

from __future__ import annotations

import re

# RFC 9112, section 3.2: Host = uri-host [ ":" port ]; an IP literal in brackets or a reg-name (IPv4 is one), the
# latter possibly empty (a target without an authority)
HOST_VALUE = re.compile(rb"(?:\[[0-9A-Za-z._~!$&'()*+,;=:%-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]*)?")
TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"  # RFC 9110 field-name
# A field: name, colon, optional whitespace, a value of visible ASCII words separated by spaces or tabs (llhttp
# drops the whitespace before a value, the protocol the whitespace after it), CRLF.
VALUE = rb"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?"
FIELD = re.compile(rb"(" + TOKEN + rb"):[ \t]*(" + VALUE + rb")[ \t]*\r\n")
FIELDS = re.compile(rb"(?:" + TOKEN + rb":[ \t]*" + VALUE + rb"[ \t]*\r\n)*")  # (a head's fields, whole)
# Fields whose meaning the one-pass read does not take on: the framing (Transfer-Encoding), an interim answer
# (Expect), a protocol switch (Upgrade), hop-by-hop options (TE, Keep-Alive) and the trailers announced.
LEFT_TO_PARSER = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"te", b"keep-alive", b"trailer"})
PLAIN_CONNECTION = b"keep-alive"  # the one Connection value read here (httpx and requests send it); others: parser
CONNECTION_FIELDS = frozenset({b"connection", b"proxy-connection"})  # (llhttp reads the second as the first)


def read_plain_request(data: bytes, request_line: bytes, max_head: int) -> tuple[list[tuple[bytes, bytes]], int] | None:
    """``data``'s header fields (names in lower case, values without the whitespace around them, in order) and the
    offset of its body, when ``data`` is exactly one whole request that begins with ``request_line`` (its method,
    target and ``HTTP/1.1``, CRLF) and is written plainly (see the module's docstring); else None.

    ``max_head``: the most bytes the request line and headers may take (bytes; longer: None, the parser refuses it).
    """
    if not data.startswith(request_line):
        return None
    start = len(request_line)
    end = data.find(b"\r\n\r\n", start - 2)
    if end < 0 or end + 4 > max_head:
        return None
    block = data[start:end + 2]
    if FIELDS.fullmatch(block) is None:
        return None
    headers = [(name.lower(), value) for name, value in FIELD.findall(block)]
    host: bytes | None = None
    length: bytes | None = None
    for name, value in headers:
        if name == b"host":
            if host is not None:
                return None
            host = value
        elif name == b"content-length":
            if length is not None:
                return None
            length = value
        elif name in LEFT_TO_PARSER or (name in CONNECTION_FIELDS and value.lower() != PLAIN_CONNECTION):
            return None
    body = end + 4
    if (host is None or length is None or not length.isdigit() or len(length) > 18 or int(length) != len(data) - body
            or HOST_VALUE.fullmatch(host) is None):
        return None
    return headers, body
