"""The HTML report: one self-contained page (no scripts, no external assets) with a leaderboard, a speedup plot,
lineage and each winner's code with its diff, checked as text and rendered in a real headless Chromium.

The Chromium test needs Debian's `chromium` package (CI: `apt-get install -y --no-install-recommends chromium`);
it is skipped, saying so, only where that binary is not installed.
"""
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from agent.archive.records import Candidate, Reverification, Timings

from agent.archive.store import Archive
from agent.cli import main
from agent.archive.report import plot, render

H200_DB = Path(__file__).parent / "data" / "h200_archive.db"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1280, 3600
PLOT_BLUE = (9, 105, 218)  # the points and the best-so-far line (#0969da)


def speed(v, low, high, roof=75.0):
    return dict(timed=True, timings=Timings(candidate_ms=0.2 / v, speedup_eager=v, eager_ci_low=low, eager_ci_high=high,
                                            pct_roofline=roof))


@pytest.fixture
def archive_path(tmp_path) -> Path:
    """The real H200 archive (rmsnorm_fwd, 2 timed kernels) plus a softmax task with a longer lineage."""
    path = tmp_path / "report.db"
    shutil.copy(H200_DB, path)
    base = dict(task_path="/x/tasks/softmax_fwd.py", task_hash="s", env={"device": "cuda", "gpu": {"name": "H200"}})
    with Archive(path) as a:
        seed = a.add(Candidate(origin="seed", proposer="seed", verdict="accepted", reason="ok", stage="timing",
                               source="import triton\nBLOCK = 128\n", **speed(1.00, 0.97, 1.03), **base))
        a.add(Candidate(origin="llm", proposer="<b>model</b>", verdict="rejected", reason="output_mismatch",
                        stage="correctness", parent_id=seed.id, source="import triton\nBLOCK = 64\n", **base))
        mid = a.add(Candidate(origin="llm", proposer="openai:gpt-x", verdict="accepted", reason="ok", stage="timing",
                              parent_id=seed.id, source="import triton\nBLOCK = 256\n", **speed(1.30, 1.25, 1.36),
                              **base))
        a.add(Candidate(origin="tuner", proposer="tuner", verdict="accepted", reason="ok", stage="timing",
                        parent_id=mid.id, source="import triton\nBLOCK = 512\n", **speed(1.10, 1.02, 1.19), **base))
        top = a.add(Candidate(origin="tuner", proposer="tuner", verdict="accepted", reason="ok", stage="timing",
                              parent_id=mid.id, source="import triton\nBLOCK = 256\nWARPS = 8\n",
                              **speed(1.52, 1.47, 1.58, roof=91.0), **base))
        a.add_reverification(Reverification(candidate_id=top.id, status="confirmed", note="accepted again",
                                            verdict="accepted", reason="ok"))
    return path


def test_report_is_one_self_contained_page(archive_path):
    with Archive(archive_path) as a:
        page = render(a)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Nothing fetched: no scripts, stylesheets, images or fonts from anywhere (the SVG namespace is a name, not a URL).
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|src=", page)
    assert re.findall(r"https?://[^'\" ]+", page) == ["http://www.w3.org/2000/svg"] * 2
    sections = re.findall(r"<section class='task' id='task-([a-z_]+)'>", page)
    assert sections == ["rmsnorm_fwd", "softmax_fwd", "swiglu_fwd"]
    soft = page[page.index("id='task-softmax_fwd'"):page.index("id='task-swiglu_fwd'")]
    board = soft[soft.index("class='leaderboard'"):soft.index("</table>")]
    assert [int(i) for i in re.findall(r"<td>#(\d+) ", board)] == [9, 7, 8, 5]  # by the CI's lower end
    assert "1.52x (95% CI 1.47-1.58)" in board and "91%" in board and ">confirmed<" in board
    assert soft.count("<circle class='point'") == 4 and soft.count("<svg") == 1
    assert "&lt;b&gt;model&lt;/b&gt;" in soft and "<b>model</b>" not in soft  # escaped, not markup
    assert "class='win'><span>#9 tuner" in soft  # the winner marked in the lineage
    code = soft[soft.index("winner-code"):]
    assert "WARPS" in code and "Diff against its parent #7" in code
    diff_block = soft[soft.index("winner-diff"):]
    assert "+WARPS = 8" in re.sub(r"<[^>]+>", "", diff_block)
    real = page[page.index("id='task-rmsnorm_fwd'"):page.index("id='task-softmax_fwd'")]
    assert "NVIDIA H200, driver 580.159.04" in real and "1.16x (95% CI 1.15-1.16)" in real
    assert real.count("<circle class='point'") == 2
    swiglu = page[page.index("id='task-swiglu_fwd'"):]
    assert "No kernel was verified" in swiglu and "Nothing was timed" in swiglu


def test_plot_puts_faster_kernels_higher_and_steps_up_at_each_new_best(archive_path):
    with Archive(archive_path) as a:
        cands = a.candidates(task="softmax_fwd.py")
    svg = plot(cands)
    points = [(float(x), float(y)) for x, y in re.findall(r"class='point' cx='([\d.]+)' cy='([\d.]+)'", svg)]
    speeds = [c.speedup for c in cands if c.accepted]
    assert len(points) == len(speeds) == 4
    by_speed = [p for _, p in sorted(zip(speeds, points))]
    assert [p[1] for p in by_speed] == sorted((p[1] for p in points), reverse=True)  # faster: smaller y (higher)
    assert [p[0] for p in points] == sorted(p[0] for p in points)  # archive order left to right
    path = re.search(r"class='best-so-far' d='([^']+)'", svg).group(1)
    heights = [float(v) for v in re.findall(r"V([\d.]+)", path)]
    assert heights == sorted(heights, reverse=True) and len(heights) == 3  # never down: 1.00, 1.30, 1.30, 1.52
    assert "Nothing was timed" in plot([c for c in cands if not c.accepted])


# ---- in a real browser ---------------------------------------------------------------------------------------
PROBE = """<pre id='probe'></pre><script>
const box = el => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  return {x: r.x + scrollX, y: r.y + scrollY, w: r.width, h: r.height,
          shown: s.display != 'none' && s.visibility != 'hidden'}; };
document.getElementById('probe').textContent = JSON.stringify({
  plots: [...document.querySelectorAll('svg.speedup-plot')].map(box),
  points: [...document.querySelectorAll('svg.speedup-plot circle.point')].map(box),
  code: [...document.querySelectorAll('.winner-code pre')].map(box),
  diffs: [...document.querySelectorAll('.winner-diff pre')].map(box),
  width: document.documentElement.scrollWidth});
</script>"""


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--force-device-scale-factor=1", f"--user-data-dir={tmp / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium for the headless render "
                                             "(apt-get install -y --no-install-recommends chromium)")
def test_report_renders_in_headless_chromium(archive_path, tmp_path, capsys):
    report = tmp_path / "report.html"
    assert main(["archive", "report", "-o", str(report), "--archive", str(archive_path)]) == 0
    assert f"wrote{report}" in "".join(capsys.readouterr().out.split())  # rich wraps a long path anywhere

    # Layout, from the browser itself: a copy of the page with a probe appended after everything else.
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium("--dump-dom", probe.as_uri(), tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<svg" in dom.stdout and "winner-code" in dom.stdout
    found = json.loads(re.search(r"<pre id=\"probe\">(.*?)</pre>", dom.stdout, re.S).group(1).replace("&quot;", '"'))
    assert len(found["plots"]) == 2 and len(found["points"]) == 6 and len(found["code"]) == 2
    for part, least in [(p, 200) for p in found["plots"]] + [(p, 40) for p in found["code"] + found["diffs"]]:
        assert part["shown"] and part["w"] > 300 and part["h"] > least, part  # the 3-line softmax kernel: 40+ px
        assert part["x"] >= 0 and part["x"] + part["w"] <= found["width"], part  # not pushed off the page
    for point in found["points"]:
        assert point["w"] >= 8 and point["h"] >= 8

    # Pixels: the screenshot of the page as written (no probe) shows the plot's blue inside the plot's box and
    # highlighted (coloured) text inside the first winner's code box.
    shot = tmp_path / "report.png"
    run = chromium(f"--screenshot={shot}", report.as_uri(), tmp=tmp_path)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    image = read_png(shot)
    assert image.shape[:2] == (HEIGHT, WIDTH)
    assert (image == 255).all(axis=2).mean() > 0.5  # a page, mostly white background
    first_plot = found["plots"][0]
    assert first_plot["y"] + first_plot["h"] < HEIGHT, "the first plot should be inside the screenshot"
    region = crop(image, first_plot)
    assert (region == PLOT_BLUE).all(axis=2).sum() > 100
    code = crop(image, found["code"][0])
    r, g, b = (code[..., i].astype(int) for i in range(3))
    coloured = (np.abs(r - g) > 60) | (np.abs(g - b) > 60) | (np.abs(r - b) > 60)
    assert coloured.sum() > 500  # syntax highlighting: keywords, strings, comments in colour


def crop(image: np.ndarray, box: dict) -> np.ndarray:
    y0, x0 = int(box["y"]), int(box["x"])
    return image[y0:min(HEIGHT, y0 + int(box["h"])), x0:x0 + int(box["w"])]


def read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB(A), non-interlaced PNG as an (h, w, 3) array: enough to read Chromium's screenshots."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = zlib.decompress(b"".join(idat))
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int64)
    for y in range(h):
        kind = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int64)
        if kind == 0:
            cur = line
        elif kind == 1:
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:
            cur = (line + prev) & 255
        else:  # average or Paeth: each byte depends on the one to its left
            got, up, ln = [0] * (stride + bpp), prev.tolist(), line.tolist()
            for i in range(stride):
                a, b = got[i], up[i]
                if kind == 3:
                    got[i + bpp] = (ln[i] + ((a + b) >> 1)) & 255
                    continue
                c = up[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                got[i + bpp] = (ln[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.array(got[bpp:], np.int64)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3]
