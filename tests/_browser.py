"""Headless Chromium driven by Selenium, for the tests that open pages: Debian's
``chromium`` and ``chromium-driver`` (``make test`` installs them), started offline, in a
fresh profile, with the browser's console log kept."""

from __future__ import annotations

import shutil
import struct
import tempfile
import zlib

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)
INSTALL_HINT = ("the browser tests need Debian's chromium and chromium-driver "
                "(`make test` installs them; or sudo apt-get install chromium chromium-driver)")


def _which(names) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def start_browser(width: int = 1280, height: int = 860):
    """A headless Chromium session; the caller quits it. Fails (never skips) with the
    install hint when Chromium or its driver is missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver = _which(CHROMIUM), _which(DRIVER)
    assert binary and driver, INSTALL_HINT
    profile = tempfile.mkdtemp(prefix="mlaxgraph-chromium-")
    options = Options()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        options.add_argument(argument)
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    session.set_page_load_timeout(60)
    session.mlaxgraph_profile = profile
    return session


def quit_browser(session) -> None:
    session.quit()
    shutil.rmtree(session.mlaxgraph_profile, ignore_errors=True)


def console_errors(session) -> list[str]:
    """The browser console's warnings and errors since the last call."""
    return [entry["message"] for entry in session.get_log("browser")
            if entry["level"] in ("SEVERE", "WARNING")]


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of RGB(A) bytes of an 8-bit RGB or RGBA PNG (what
    Chromium's screenshots are), decoded with zlib alone."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, [], None
    while position < len(data):
        (length,) = struct.unpack(">I", data[position:position + 4])
        kind = data[position + 4:position + 8]
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * step
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - step] if x >= step else 0
            up = previous[x]
            corner = previous[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows
