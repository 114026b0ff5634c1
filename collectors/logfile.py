"""Read an engine's log (plain file, .gz or stdin) and return the startup asked for.

Logs on inference nodes grow to gigabytes, and the startup that matters is usually the last
one. A plain file is therefore read from the end: the last of the engine's anchor lines (its
plug-in's ``anchors``: SGLang's ``Load weight begin``) is found by a backward search in fixed-size
blocks (read ahead by a second thread), a window before it is parsed forward until that startup
has ended, and the window only grows when the startup began earlier. Reads are bounded
blocks (not mmap, whose touched pages count as the process's memory), so memory stays flat
whatever the file size.
Lines are not split one by one: each block is searched for a few keywords that every memory
line contains, and only the lines around the hits are decoded and parsed.

Compressed files and stdin cannot be read backwards; they are streamed once, forward. So is a
container runtime's CRI log (``/var/log/pods/…/0.log``): its long lines are split into partial
records that must be joined, in order, before a line can be parsed (collectors/shipping.py).
Every line is handed to the engine's parser without what a shipper put before it (a CRI or
``--timestamps`` timestamp, ANSI colour, a pasted ``> ``), so any engine reads through them.
"""

from __future__ import annotations

import itertools
import os
import stat
import sys
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple, Union

from kvforensics.collectors import backsearch, events, lineformat, shipping
from kvforensics.collectors.events import EngineStartup as Startup
from kvforensics.collectors.plugin import ENGINES, EngineCollectors

_GENERIC_KINDS = ("failure", "exception", "frame", "unrecognized")


def _keywords(engines: Tuple[EngineCollectors, ...]) -> Tuple[bytes, ...]:
    """Every line a parser recognises contains one of these: the needles of the engines' line-format
    rows, reduced to the fewest that still find every row (collectors/lineformat.py); idle lines
    (a server's stat lines) are looked for apart, only when a startup awaits its end."""
    return lineformat.keywords(tuple(row for e in engines for row in e.formats))


_KEYWORD_CACHE: Dict[Tuple[str, ...], Tuple[bytes, ...]] = {}


def keywords_for(engine: str) -> Tuple[bytes, ...]:
    """The needles of one engine's lines ("auto": every engine's). Each needle costs a pass over
    every block: once the engine is known, search only its own."""
    chosen = (ENGINES.get(engine),) if ENGINES.find(engine) is not None else ENGINES.all()
    key = tuple(e.name for e in chosen)
    if key not in _KEYWORD_CACHE:
        _KEYWORD_CACHE[key] = _keywords(chosen)
    return _KEYWORD_CACHE[key]


SNIFF_BYTES = 256 << 10  # the head and the tail of a file say whose log it is (~1,000 lines each)
CRI_SNIFF_BYTES = 64 << 10  # its first lines say whether a file is a container runtime's (CRI) log
BLOCK_BYTES = 4 << 20
WHOLE_FILE_BYTES = 32 << 20  # below this, read everything: counts and line numbers are exact
FIRST_WINDOW_BYTES = 8 << 20
LINE_COUNT_LIMIT_BYTES = 512 << 20  # counting newlines runs at ~2.4 GB/s here (bench/)
MAX_AFTER_ANCHOR_BYTES = 256 << 20
GRACE_BLOCKS = 1  # blocks read after a startup closed: late ranks' last lines
# Past the anchor a window is read in blocks this small, so what is read after the startup closed
# (the rest of a block and GRACE_BLOCKS more) costs ~2 MiB of keyword search, not ~8.
AFTER_ANCHOR_BLOCK_BYTES = 1 << 20
NEAR_BYTES = 256 << 10  # a backward search first reads this much alone, then 4x and 16x more (_Blocks.rfind)


class LogReadError(Exception):
    """The log cannot be read or holds no startup; ``message`` is one actionable sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class LogExcerpt:
    """The chosen startup and what is known about the others."""

    source: str
    startup: Startup
    index: Optional[int]  # 1-based from the start of the file; None when not all was read
    index_from_end: int  # -1 = the last startup
    count: Optional[int]  # startups in the file; None when the start of the file was not read
    window_start: int  # byte offset where reading began
    notes: Tuple[str, ...]  # what the reader could not do, in plain words
    engine: str  # whose log it is: a registered engine's name


class _Sink:
    """One engine's parser and startup segmenter, fed the keyword lines; ``score`` counts the lines
    only that engine prints (engine detection)."""

    def __init__(self, engine: EngineCollectors, keep: Optional[int] = None) -> None:
        self.engine = engine.name
        self.plugin = engine
        self.parse = engine.parse_line
        self.seg = engine.segmenter(keep=keep)
        self.score = 0
        self.idle_b = tuple(n.encode() for n in engine.idle_needles)

    def feed(self, raw: str, line: Optional[int], offset: int) -> None:
        # Every engine reads the line as it wrote it: a shipper's prefix would hide the engine's own.
        for ev in self.parse(shipping.unwrap(raw), line, offset):
            if ev.kind not in _GENERIC_KINDS or self.plugin.owns_event(ev):
                self.score += 1
            self.seg.feed(ev)


def _sinks(engine: str, keep: Optional[int]) -> List[_Sink]:
    if engine == "auto":
        return [_Sink(e, keep) for e in ENGINES.all()]
    return [_Sink(ENGINES.get(engine), keep)]


def _winner(sinks: List[_Sink]) -> _Sink:
    """The engine whose own line shapes the log holds most; the first registered on a tie (and for no startup)."""
    best = sinks[0]
    for s in sinks[1:]:
        if s.score > best.score:
            best = s
    return best


def read_log(path: str, startup: int = -1, count_lines: bool = False, engine: str = "auto") -> LogExcerpt:
    """Read ``path`` (``-`` = stdin) and return startup ``startup`` (1-based, or -1 = last).

    ``engine``: a registered engine's name, or "auto" (the engine whose own line shapes the log holds)."""
    if startup == 0:
        raise LogReadError("usage", "--startup counts from 1 (first) or from -1 (last); 0 is neither")
    if engine != "auto" and ENGINES.find(engine) is None:
        raise LogReadError("usage", "--engine-kind must be auto or one of {}, not {!r}".format(
            ", ".join(ENGINES.names()), engine))
    if path == "-":
        return _from_stream(sys.stdin.buffer, "<stdin>", startup, engine)
    _check_path(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):  # /dev/zero, a tty: endless
            raise LogReadError("unreadable", "{}: is a {}, not a log file (kvforensics reads files, pipes and "
                               "stdin)".format(path, _KINDS.get(stat.S_IFMT(mode), "special file")))
        if not stat.S_ISREG(mode):  # a FIFO, <(cat log)
            return _from_pipe(path, startup, engine)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            known = _REFUSED.get(_identity(st))
            if known is not None:  # refused before, unchanged since: a look does not read it again
                raise LogReadError(known[0], known[1])
            size = st.st_size  # what is read: the file as it is now, not what a runtime keeps appending
            head = f.read(CRI_SNIFF_BYTES)
            magic = head[:4]
            f.seek(0)
            try:
                if shipping.looks_cri(head):  # its partial records are joined in file order: read forward
                    return _from_stream(_Upto(f, size), path, startup, engine)
                if magic[:2] == b"\x1f\x8b":
                    return _from_stream(_Gunzip(_Upto(f, size), size, path), path, startup, engine)
                if magic[:2] in (b"\xff\xfe", b"\xfe\xff") or _looks_utf16(magic):
                    return _from_stream(_Utf16AsUtf8(_Upto(f, size), magic), path, startup, engine)
            except LogReadError as exc:
                if exc.code in ("binary", "bomb"):
                    _remember_refusal(st, exc)
                raise
            if size == 0:
                raise LogReadError("empty", "{}: the file is empty".format(path))
            src = _Blocks(f, size)
            if engine == "auto":
                engine = _sniff(src, size)
            return _from_file(src, path, size, startup, count_lines, engine)
    except PermissionError:
        raise LogReadError("unreadable", "{}: permission denied (run as a user who can read it)".format(path)) from None
    except (OSError, EOFError) as exc:  # gzip's BadGzipFile is an OSError
        raise LogReadError("unreadable", "{}: cannot read: {}".format(path, _one_line(exc))) from None


_KINDS = {stat.S_IFCHR: "character device", stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket"}
# Files refused as not text (binary, a decompression bomb), by identity and version: serve and record look at
# the same rotated files again and again, and a refusal costs a read. Bounded: the oldest go first.
_REFUSED: "Dict[Tuple[int, int, int, int], Tuple[str, str]]" = {}
MAX_REFUSED = 256


def _identity(st: os.stat_result) -> Tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _remember_refusal(st: os.stat_result, exc: "LogReadError") -> None:
    if len(_REFUSED) >= MAX_REFUSED:
        _REFUSED.pop(next(iter(_REFUSED)))
    _REFUSED[_identity(st)] = (exc.code, str(exc))


class _Upto:
    """The first ``size`` bytes of a file: its size when opened, so a log that grows while it is read (a
    runtime writing 100 MB/s into a CRI file) ends where it ended then."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self._left = size

    def read(self, n: int) -> bytes:
        if self._left <= 0:
            return b""
        data = self._f.read(min(n, self._left))
        self._left -= len(data)
        return data


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        if os.path.islink(path):
            raise LogReadError("missing", "{}: a symbolic link that leads nowhere (dangling, or a loop)".format(path))
        raise LogReadError("missing", "{}: no such file".format(path))
    if os.path.isdir(path):
        raise LogReadError("directory", "{}: is a directory; pass the log file inside it".format(path))


FIFO_WAIT_S = 10.0
# Streams (stdin, pipes, .gz) are read in small pieces: a .gz cut short loses at most one piece.
STREAM_READ_BYTES = 256 << 10  # how long a pipe may stay silent before we say nothing writes to it


def _from_pipe(path: str, which: int, engine: str = "auto") -> LogExcerpt:
    """A FIFO or process substitution: streamed like stdin. Opened without blocking, so a FIFO that
    nothing writes to is an error after FIFO_WAIT_S, not a hang."""
    import select

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready, _, _ = select.select([fd], [], [], FIFO_WAIT_S)
        if not ready:
            raise LogReadError("unreadable", "{}: nothing wrote to this pipe for {:.0f} s".format(path, FIFO_WAIT_S))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return _from_stream(f, path, which, engine)
    finally:
        if fd != -1:
            os.close(fd)


def _looks_utf16(head: bytes) -> bool:
    """UTF-16 without a BOM: ASCII text with a NUL after (LE) or before (BE) every character."""
    if len(head) < 4:
        return False
    little = head[1] == 0 and head[3] == 0 and head[0] != 0 and head[2] != 0
    big = head[0] == 0 and head[2] == 0 and head[1] != 0 and head[3] != 0
    return little or big


# A rotated log compresses 10–50×; what inflates past this many times its size, or past the floor for small
# files, is refused (a .gz of 4 GiB of zeros is 4 MiB).
MAX_INFLATE_RATIO = 100
MIN_INFLATE_CAP = 64 << 20


class _Gunzip:
    """gzip decompressed piece by piece (every member of a concatenated file): a file cut short
    yields what was decompressed before the cut and then says so, instead of losing it all."""

    def __init__(self, f: BinaryIO, compressed: int = 0, source: str = "<gzip>") -> None:
        self._f = f
        self._source = source
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""  # input not yet inflated (each call inflates at most n bytes)
        self._out = 0
        self._cap = max(MIN_INFLATE_CAP, compressed * MAX_INFLATE_RATIO)

    def read(self, n: int) -> bytes:
        out = b""
        while not out:
            if not self._pending:
                self._pending = self._f.read(64 << 10)
                if not self._pending:
                    return self._end()
            out = self._d.decompress(self._pending, n)
            self._pending = self._d.unconsumed_tail
            if self._d.eof and self._d.unused_data:  # the next member of a concatenated .gz
                self._pending = self._d.unused_data + self._pending
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._out += len(out)
        if self._out > self._cap:
            raise LogReadError("bomb", "{}: this .gz inflates past {:,} MiB ({}× its size): a decompression bomb, not "
                               "a rotated log".format(self._source, self._cap >> 20, MAX_INFLATE_RATIO))
        return out

    def _end(self) -> bytes:
        if not self._d.eof and (self._d.unconsumed_tail or self._d.unused_data == b""):
            tail = self._d.flush()
            if tail:
                return tail
            raise EOFError("the gzip stream is cut short")
        return b""


class _Utf16AsUtf8:
    """A UTF-16 log (Windows tools, PowerShell redirection) read as the UTF-8 bytes the parser expects."""

    def __init__(self, f: BinaryIO, head: bytes) -> None:
        import codecs

        encoding = "utf-16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else (
            "utf-16-le" if head[1:2] == b"\x00" else "utf-16-be")
        self._reader = codecs.getreader(encoding)(f, errors="replace")

    def read(self, n: int) -> bytes:
        return self._reader.read(n // 2).encode("utf-8")


def _sniff(src: "_Blocks", size: int) -> str:
    """The engine of a plain file, from its first and last few MiB."""
    sinks = _sinks("auto", 1)
    _scan_block(_whole_lines(src.read(0, min(size, SNIFF_BYTES))), 0, None, sinks)
    if size > SNIFF_BYTES:
        tail = src.read(max(SNIFF_BYTES, size - SNIFF_BYTES), SNIFF_BYTES)
        _scan_block(tail[tail.find(b"\n") + 1:], 0, None, sinks)
    if any(s.score for s in sinks):
        return _winner(sinks).engine
    # Head and tail are all runtime lines (a server that ran for days): the engine of the last
    # startup anchor in the file, found in one backward pass for every engine's anchors at once.
    owner = {n: e.name for e in reversed(ENGINES.all()) for n in e.anchors}
    at = src.rfind(tuple(owner))
    if at == -1:
        return ENGINES.first().name
    here = src.read(at, max(len(n) for n in owner))
    needle, name = next((n, e) for n, e in owner.items() if here.startswith(n))
    src.last_anchor = (needle, at)  # no anchor of any engine lies after it: _from_file need not search again
    return name


def _whole_lines(block: bytes) -> bytes:
    cut = block.rfind(b"\n")
    return block if cut == -1 else block[:cut + 1]


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# --- block scanning ------------------------------------------------------------------------


Where = Callable[[int], Tuple[Optional[int], int]]


def _scan_block(buf: bytes, base_offset: int, base_line: Optional[int], sinks: List[_Sink],
                where: Optional[Where] = None) -> int:
    """Parse the keyword lines of ``buf`` (whole lines only); return its newline count.

    An engine's idle lines (a server's stat lines, most of its log) are counted, and parsed only
    where one ends a startup still open: the first after the open startup's last line.
    ``where``: the (line number, byte offset) in the source of the line at a position of ``buf``,
    when ``buf`` is not a piece of the source (joined CRI records)."""
    starts = _keyword_lines(buf, keywords_for(sinks[0].engine if len(sinks) == 1 else "auto"))
    idle = tuple(n for s in sinks for n in s.idle_b)
    if len(sinks) > 1:  # detecting the engine: idle lines are lines only their engine prints
        for sink in sinks:
            sink.score += sum(buf.count(n) for n in sink.idle_b)
    line = base_line
    prev = 0  # where the newline count stands
    fed_end = 0  # the end of the last line fed

    splitter = _splitter(sinks)

    def feed(start: int) -> None:
        nonlocal line, prev, fed_end
        end = buf.find(b"\n", start)
        if end == -1:
            end = len(buf)
        if line is not None:
            line += buf.count(b"\n", prev, start)
            prev = start
        fed_end = end
        number, at = (None if line is None else line + 1, base_offset + start) if where is None else where(start)
        cuts = _cuts(buf, start, end, splitter)
        for a, b in zip(cuts, cuts[1:] + [end]):
            # Each piece of a cut line is its own row, at its own offset (so a saved startup keeps each).
            raw = buf[a:b].decode("utf-8", "replace")
            for sink in sinks:
                sink.feed(raw, number, at + (a - start))

    def feed_idle_before(limit: int) -> None:
        """Feed the first idle line between the last fed line and ``limit`` if a startup awaits it."""
        if idle and any(s.idle_b and s.seg.awaiting_end for s in sinks):
            hits = [h for h in (buf.find(n, fed_end, limit) for n in idle) if h != -1]
            if hits:
                feed(buf.rfind(b"\n", 0, min(hits)) + 1)

    for start in sorted(starts):
        feed_idle_before(start)
        feed(start)
    feed_idle_before(len(buf))
    return buf.count(b"\n") if base_line is not None else 0


def _keyword_lines(buf: bytes, keywords: Tuple[bytes, ...]) -> "set[int]":
    """Where the lines of ``buf`` that hold a keyword begin.

    Searched from the end with ``rfind``: CPython's reverse search skips ahead on a bloom filter of
    the needle's bytes and runs 2-3x (3.11) to 3-20x (3.8, 3.12) faster than ``find`` over serving
    lines (bench/RESULTS.md, "log scan"); after a hit the search goes on before the hit's line,
    so each line costs one newline search per keyword, however many hits it holds."""
    starts = set()
    for kw in keywords:
        i = buf.rfind(kw)
        while i != -1:
            start = buf.rfind(b"\n", 0, i) + 1
            starts.add(start)
            i = buf.rfind(kw, 0, start - 1) if start else -1
    return starts


# A line longer than this is cut where its engine's records begin (records glued into one physical
# line, e.g. to a progress bar that never printed a newline), and each piece is parsed alone: the
# parser's work and the text each event keeps stay bounded by a record, not by the line.
LONG_LINE_BYTES = 1 << 20


def _splitter(sinks: List[_Sink]) -> Optional[Callable[[bytes, int, int], Iterator[int]]]:
    return next((s.plugin.record_starts for s in sinks if s.plugin.record_starts is not None), None)


def _cuts(buf: bytes, start: int, end: int, splitter: Optional[Callable[[bytes, int, int], Iterator[int]]]
          ) -> List[int]:
    """Where the line ``buf[start:end]`` is cut into pieces: its start, and for a long line each record start."""
    if splitter is None or end - start <= LONG_LINE_BYTES:
        return [start]
    return [start] + [at for at in splitter(buf, start, end) if at > start]


def _last_record(buf: bytes, splitter: Optional[Callable[[bytes, int, int], Iterator[int]]], since: int = 1) -> int:
    """Where the last record that begins in ``buf[since:]`` (not at 0) begins; 0 when none does. A block
    of one endless line is cut there, so no record is split between two blocks."""
    if splitter is None:
        return 0
    return max(splitter(buf, max(1, since), len(buf)), default=0)


BINARY_SNIFF_BYTES = 64 << 10


class _NotText(Exception):
    """A stream whose first bytes are mostly NUL (/dev/zero piped in, a disk image): refused at once."""


class _LineBlocks:
    """A stream in blocks of whole lines (the last may lack its newline); after iterating, ``size``,
    ``saw_nul`` and ``notes`` (a stream cut short) say what was read."""

    def __init__(self, stream: BinaryIO, splitter: Optional[Callable[[bytes, int, int], Iterator[int]]] = None
                 ) -> None:
        self.stream = stream
        self.splitter = splitter  # an engine's record_starts: where an endless line may be cut
        self.size = 0
        self.saw_nul = False
        self.notes: Tuple[str, ...] = ()

    def __iter__(self) -> Iterator[bytes]:
        carry = b""
        while True:
            try:
                chunk = self.stream.read(STREAM_READ_BYTES)
            except (EOFError, OSError, zlib.error) as exc:  # a .gz cut short: keep the startups read before the cut
                self.notes = ("the input ends early ({}): what follows the cut is missing".format(_one_line(exc)),)
                chunk = b""
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) > BLOCK_BYTES:  # one endless line: cut at its last record start (only
                cut = _last_record(data, self.splitter, len(carry) - 64)  # the new chunk is searched)
            if cut == 0:
                carry = data
                if len(carry) <= BLOCK_BYTES * 4:
                    continue
                cut = len(carry)  # no record start either: parse what we have
            block, carry = data[:cut], data[cut:]
            yield self._seen(block)
        if carry:
            yield self._seen(carry)

    def _seen(self, block: bytes) -> bytes:
        head = block[:BINARY_SNIFF_BYTES]
        if self.size == 0 and head.count(b"\x00") * 2 > len(head):  # mostly NUL from the start: never a log
            raise _NotText()
        self.saw_nul = self.saw_nul or b"\x00" in block[:8192]
        self.size += len(block)
        return block


def _from_stream(stream: BinaryIO, source: str, which: int, engine: str = "auto") -> LogExcerpt:
    sinks = _sinks(engine, which)  # memory stays flat however many startups stream past
    reader = _LineBlocks(stream, _splitter(sinks))
    blocks = iter(reader)
    try:
        first = next(blocks, b"")
    except _NotText:
        raise LogReadError("binary", "{}: this is not a text log (it begins with NUL bytes)".format(source)) from None
    everything = itertools.chain((first,), blocks)
    if shipping.looks_cri(first[:CRI_SNIFF_BYTES]):
        notes = _scan_cri(everything, sinks)
    else:
        notes = _scan_plain(everything, sinks)
    if reader.size == 0:
        raise LogReadError("empty", "{}: the input is empty".format(source))
    win = _winner(sinks)
    return _choose(win.seg.result(), source, which, complete=True, window_start=0,
                   size=reader.size, notes=reader.notes + notes, binary=reader.saw_nul, engine=win.engine)


def _scan_plain(blocks: Iterator[bytes], sinks: List[_Sink]) -> Tuple[str, ...]:
    offset = 0
    line = 0
    for block in blocks:
        line += _scan_block(block, offset, line, sinks)
        offset += len(block)
    return ()


# A block with no partial record is read as a plain file's block (fast: no line is split in Python).
# Searched as plain bytes, not a regex (5x faster): a message holding one only costs the slow path.
_CRI_PARTIAL = (b" stdout P ", b" stderr P ", b" stdout P:", b" stderr P:")  # ":" begins more tags


def _scan_cri(blocks: Iterator[bytes], sinks: List[_Sink]) -> Tuple[str, ...]:
    """A CRI log: partial records joined into the lines the engine wrote, each cited at its first
    record (its line number counts the file's records, so an editor's line N is the report's)."""
    joiner = shipping.CriJoiner()
    offset = 0
    line = 0
    for block in blocks:
        if not joiner.pending and not any(p in block for p in _CRI_PARTIAL):
            _scan_block(block, offset, line, sinks)  # every record here is a whole line
        else:
            _scan_joined(_join(joiner, block, line, offset), sinks)
        line += block.count(b"\n")
        offset += len(block)
    _scan_joined(joiner.finish(), sinks)
    return _cri_notes(joiner)


def _join(joiner: shipping.CriJoiner, block: bytes, line: int, offset: int) -> List[shipping.Joined]:
    """The lines whose last record is in ``block`` (records numbered from ``line`` + 1)."""
    out = []
    records = block.split(b"\n")
    if block.endswith(b"\n"):
        records.pop()
    for record in records:
        line += 1
        joined = joiner.feed(record, line, offset)
        if joined is not None:
            out.append(joined)
        offset += len(record) + 1
    return out


def _scan_joined(lines: List[shipping.Joined], sinks: List[_Sink]) -> None:
    if not lines:
        return
    import bisect  # imports of the rarer paths wait for them: a small plain log pays only for what it reads

    starts = list(itertools.accumulate([0] + [len(j.text) + 1 for j in lines[:-1]]))

    def where(start: int) -> Tuple[Optional[int], int]:
        found = lines[bisect.bisect_right(starts, start) - 1]
        return found.line, found.offset

    _scan_block(b"\n".join(j.text for j in lines) + b"\n", 0, None, sinks, where)


def _cri_notes(joiner: shipping.CriJoiner) -> Tuple[str, ...]:
    notes = []
    if joiner.joined:
        notes.append("a container runtime's (CRI) log: {:,} line(s) it split into partial records were "
                     "joined; line numbers count the file's records (a joined line is cited at its first)".format(
                         joiner.joined))
    if joiner.cut:
        notes.append("{:,} line(s) longer than {} MiB were cut there: the rest of each was not read".format(
            joiner.cut, joiner.cap >> 20))
    return tuple(notes)


class _Blocks:
    """Positioned reads of a seekable file, in bounded blocks."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f = f
        self.size = size
        self.last_anchor: Optional[Tuple[bytes, int]] = None  # (needle, offset) the engine sniff found last

    def read(self, pos: int, n: int) -> bytes:
        self.f.seek(pos)
        return self.f.read(n)

    def rfind(self, needle: Union[bytes, Tuple[bytes, ...]], end: Optional[int] = None, start: int = 0) -> int:
        """Offset of the last ``needle`` (or of the last of several) that begins in [start, end), or -1; reads
        backwards block by block, so a needle near the end costs one block whatever the file size (the far
        part: collectors/backsearch.py, a reader thread and, with more CPUs free, up to three more processes;
        a search bounded by ``start`` reads its far part in one piece)."""
        pos = self.size if end is None else end
        needles = (needle,) if isinstance(needle, bytes) else needle
        overlap = max(len(n) for n in needles) - 1
        if pos <= start:
            return -1
        # Most searches end close by (a line's start, an anchor just before the end): reads growing 4x each
        # time answer them without the reader thread and its buffers (~15 ms). 4x, not 16x at once: a needle just
        # past a read then costs at most ~5x the bytes before it (not ~17x), for one more read at worst.
        for span in (NEAR_BYTES, NEAR_BYTES * 4, NEAR_BYTES * 16):
            near = max(start, pos - span)
            at = self._last_in(near, pos, needles, overlap)
            if at != -1 or near == start:
                return at
            pos = near
        if start == 0:
            return backsearch.last(self.f.fileno(), needles, pos, self.size, BLOCK_BYTES)
        return self._last_in(start, pos, needles, overlap)  # a bounded search's far part: one read

    def _last_in(self, near: int, pos: int, needles: Tuple[bytes, ...], overlap: int) -> int:
        """The last needle that begins in [near, pos), from one read that reaches ``overlap`` bytes past ``pos``."""
        piece = self.read(near, min(pos - near + overlap, self.size - near))
        return max((near + h for h in (piece.rfind(n, 0, pos - near + len(n) - 1) for n in needles) if h != -1),
                   default=-1)

    def line_start(self, pos: int) -> int:
        if pos <= 0:
            return 0
        nl = self.rfind(b"\n", pos)
        return nl + 1

    def count_newlines(self, end: int) -> int:
        total = 0
        for pos in range(0, end, BLOCK_BYTES):
            total += self.read(pos, min(BLOCK_BYTES, end - pos)).count(b"\n")
        return total


def _scan_window(src: _Blocks, start: int, anchor: int, base_line: Optional[int],
                 keep: Optional[int], engine: str) -> Tuple[Any, List[str]]:
    """Parse forward from ``start`` until the startup holding ``anchor`` has ended (``keep``: see
    StartupSegmenter)."""
    sink = _Sink(ENGINES.get(engine), keep)
    seg = sink.seg
    notes: List[str] = []
    pos = start
    line = base_line
    blocks_after_close = 0
    while pos < src.size:
        # Up to the anchor in big blocks; past it in small ones (the startup may close any time).
        block = src.read(pos, min(BLOCK_BYTES, max(anchor - pos, 0) + AFTER_ANCHOR_BLOCK_BYTES))
        if pos + len(block) < src.size:
            cut = block.rfind(b"\n")
            if cut != -1:
                block = block[:cut + 1]
            else:  # one endless line: cut at its last record start, so no record is split between blocks
                block = block[:_last_record(block, sink.plugin.record_starts) or len(block)]
        counted = _scan_block(block, pos, line, [sink])
        if line is not None:
            line += counted
        pos += len(block)
        if pos > anchor:
            if seg.current_closed:
                blocks_after_close += 1
                if blocks_after_close > GRACE_BLOCKS:
                    break
            elif pos - anchor > MAX_AFTER_ANCHOR_BYTES:
                notes.append("stopped reading {} MiB after the last startup began: it never printed "
                             "{}".format(MAX_AFTER_ANCHOR_BYTES >> 20, ENGINES.get(engine).end_words))
                break
    return seg, notes


def _window_start(src: _Blocks, anchor: int, back: int) -> int:
    """Where a window of ``back`` bytes before the anchor begins: the start of the line there, unless
    that line began more than a window earlier (one endless line of glued records), then inside it,
    or the window would be the whole file. A startup the edge cuts is dropped as any other
    (begins_cleanly)."""
    start = src.line_start(anchor - back)
    return anchor - back if anchor - back - start > back else start


def _find_anchor(src: _Blocks, plugin: EngineCollectors) -> int:
    """Where the last startup's anchor line begins, or -1."""
    known = _known_anchor(src, plugin.anchors, plugin.anchors_in_order)
    if known is not None:
        return known
    if plugin.anchors_in_order:  # the first anchor found wins; the later ones are fallbacks
        return next((at for at in (src.rfind(n) for n in plugin.anchors) if at != -1), -1)
    return src.rfind(plugin.anchors)  # no one line every startup prints: the last of any of them


def _known_anchor(src: _Blocks, anchors: Tuple[bytes, ...], in_order: bool) -> Optional[int]:
    """Where this engine's anchor is, when the engine sniff already found the last anchor of every
    engine and it is one that answers this search (the first anchor, when the first found wins)."""
    if src.last_anchor is None:
        return None
    needle, at = src.last_anchor
    answers = needle == anchors[0] if in_order else needle in anchors
    return at if answers else None


def _from_file(src: _Blocks, source: str, size: int, which: int, count_lines: bool, engine: str) -> LogExcerpt:
    binary = b"\x00" in src.read(0, 8192)
    if which > 0 or size <= WHOLE_FILE_BYTES:
        seg, whole_notes = _scan_window(src, 0, size, 0, keep=which, engine=engine)
        return _choose(seg.result(), source, which, True, 0, size, tuple(whole_notes), binary, engine)
    plugin = ENGINES.get(engine)
    anchor = _find_anchor(src, plugin)
    notes: List[str] = []
    if anchor == -1:  # a fragment without a load line: read the tail only
        anchor = max(0, size - MAX_AFTER_ANCHOR_BYTES // 4)
        notes.append("no {} line in the file; read its last {} MiB".format(
            plugin.anchor_words, (size - anchor) >> 20))
    launched = _from_launch(src, anchor, plugin, engine, count_lines) if which == -1 else None
    if launched is not None:
        start, base_line, startups, window_notes = launched
        return _choose(startups, source, which, start == 0, start, size,
                       tuple(notes + _uncounted(start, base_line) + window_notes), binary, engine)
    back = FIRST_WINDOW_BYTES
    while True:
        start = _window_start(src, anchor, back)
        base_line = _base_line(src, start, count_lines)
        seg, window_notes = _scan_window(src, start, anchor, base_line, keep=None, engine=engine)
        startups = seg.result()
        first_whole = bool(startups) and plugin.begins_cleanly(startups[0], start, back)
        if start == 0 or len(startups) > -which or (first_whole and len(startups) == -which):
            break
        back *= 4
    notes.extend(_uncounted(start, base_line))
    if start > 0 and not first_whole:
        startups = startups[1:]  # the window edge may have cut it: never report a partial startup
    return _choose(startups, source, which, start == 0, start, size, tuple(notes + window_notes), binary, engine)


def _base_line(src: _Blocks, start: int, count_lines: bool) -> Optional[int]:
    return 0 if start == 0 else (src.count_newlines(start) if count_lines or start <= LINE_COUNT_LIMIT_BYTES else None)


def _uncounted(start: int, base_line: Optional[int]) -> List[str]:
    if base_line is not None:
        return []
    return ["line numbers unknown: the {:.1f} GiB before the startup were not counted (evidence gives byte "
            "offsets; --exact-lines counts them)".format(start / (1 << 30))]


def _from_launch(src: _Blocks, anchor: int, plugin: EngineCollectors, engine: str,
                 count_lines: bool) -> Optional[Tuple[int, Optional[int], List[Startup], List[str]]]:
    """The last startup read from its own launch line (``server_args=``, ``non-default args:``), when one
    lies in the first window before the anchor: every launch opens with it, so nothing before it belongs
    to this startup, and the window's other megabytes need no keyword search (~30 ms of a log whose
    startup is near its end). None, and the window is read as before, when there is no such line (vLLM
    before 0.10, a fragment, glued records) or the startup read from it does not begin there cleanly."""
    if not plugin.launch_lines:
        return None
    low = max(0, anchor - FIRST_WINDOW_BYTES)
    hit = src.rfind(plugin.launch_lines, anchor, low)  # in the window only: never a search to the file's top
    if hit == -1:
        return None
    newline = src.rfind(b"\n", hit, low)
    if newline == -1 and low > 0 and src.read(low - 1, 1) != b"\n":
        return None  # a line that began before the window (glued records): the window's own rules
    start = low if newline == -1 else newline + 1
    base_line = _base_line(src, start, count_lines)
    seg, notes = _scan_window(src, start, anchor, base_line, keep=None, engine=engine)
    startups = seg.result()
    if not startups or startups[0].first_offset != start or not plugin.begins_cleanly(startups[0], start, 0):
        return None
    return start, base_line, startups, notes


def _choose(startups: List[Startup], source: str, which: int, complete: bool, window_start: int,
            size: Optional[int], notes: Tuple[str, ...], binary: bool, engine: str) -> LogExcerpt:
    if not startups:
        if binary:
            raise LogReadError("binary", "{}: this is not a text log (it contains NUL bytes)".format(source))
        plugin = ENGINES.get(engine)
        raise LogReadError("no_startup", "{}: no {} startup lines found (looked for {})".format(
            source, plugin.display, plugin.no_startup_hint))
    n = len(startups)
    if which > 0 and which > n:
        raise LogReadError("usage", "{}: --startup {} does not exist; the file holds {} startup(s)".format(
            source, which, n))
    if which < 0 and -which > n:
        raise LogReadError("usage", "{}: --startup {} does not exist; {} startup(s) found{}".format(
            source, which, n, "" if complete else " in the part read"))
    pos = which - 1 if which > 0 else n + which
    notes = notes + events.notes(startups[pos])
    return LogExcerpt(
        source=source,
        startup=startups[pos],
        index=pos + 1 if complete else None,
        index_from_end=pos - n,
        count=n if complete else None,
        window_start=window_start,
        notes=notes if complete else notes + (
            "only the last {:.1f} MiB were read: {} startup(s) there; earlier ones were not counted".format(
                ((size or 0) - window_start) / (1 << 20), n),),
        engine=engine,
    )


__all__ = ["LogExcerpt", "LogReadError", "read_log", "keywords_for"]
