"""XML read safely: no DTDs, entities or external references, bounded depth and lengths.

The one reader of XML text in topocoll (NCCL topology files). It keeps what an importer's
error messages need (each element's line) and the comments (which carry what topocoll wrote
itself), and refuses, with a :class:`FormatError` naming the file and line, what a topology
file never needs and a hostile one uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.etree.ElementTree import ParseError

from defusedxml import DefusedXmlException, DTDForbidden
from defusedxml.ElementTree import DefusedXMLParser

from topocoll.errors import FormatError

__all__ = ["MAX_XML_ATTRIBUTE_CHARS", "MAX_XML_DEPTH", "XmlDocument", "XmlElement", "read_xml", "root_tag"]

MAX_XML_DEPTH = 64
"""Deepest element nesting read.

The real files in ``tests/data/topologies`` nest at most 8 levels (``system``, ``cpu``, three
``pci`` bridges, the GPU's own ``pci``, ``gpu``, ``nvlink``); every PCIe switch adds two
``pci`` levels (upstream and downstream port), so 64 leaves room for about 28 switches in a
chain, more than any server has. It also bounds the importer's walk of the ``pci`` tree, which
recurses once per level, far inside Python's recursion limit (1000 by default)."""

MAX_XML_ATTRIBUTE_CHARS = 4096
"""Longest attribute value (and element or attribute name) read.

NCCL keeps attribute values in 256-byte buffers (``MAX_STR_LEN`` 255 in its
``src/graph/xml.h``), so a file NCCL reads or writes has none longer than 255 characters; the
longest in ``tests/data/topologies`` has 53. 4096 leaves room for hand-edited files and for
names that topocoll writes back (``<net name=...>``), and refuses a value that is only there
to fill memory."""

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


@dataclass(slots=True)
class XmlElement:
    """One element: tag, attributes, child elements and the line it starts on."""

    tag: str
    attrs: dict[str, str]
    line: int
    children: list["XmlElement"] = field(default_factory=list)

    def find_all(self, tag: str) -> list["XmlElement"]:
        """Direct children named ``tag``, in document order."""
        return [child for child in self.children if child.tag == tag]

    def find(self, tag: str) -> "XmlElement | None":
        """The first direct child named ``tag``, or None."""
        found = self.find_all(tag)
        return found[0] if found else None


@dataclass(frozen=True, slots=True)
class XmlDocument:
    """A parsed document: the root element and the text of its comments, in order."""

    root: XmlElement
    comments: tuple[str, ...]


class _Refused(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(line, reason)
        self.line = line
        self.reason = reason


def _shown(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for an error message."""
    return text if len(text) <= limit else text[:limit] + "..."


def _blank_comments(text: str) -> str:
    """``text`` with comments blanked out, newlines kept (offsets still map to lines)."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


class _TreeTarget:
    """Builds :class:`XmlElement` trees with line numbers from the parser's events, refusing
    nesting and names or values beyond the limits as soon as they appear."""

    def __init__(self) -> None:
        self.line_of = lambda: 0  # set to the parser's current line once it exists
        self.stack: list[XmlElement] = []
        self.roots: list[XmlElement] = []
        self.comments: list[str] = []

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        line = self.line_of()
        if len(self.stack) >= MAX_XML_DEPTH:
            raise _Refused(line, f"<{_shown(tag)}> is nested deeper than {MAX_XML_DEPTH} levels")
        for piece in (tag, *attrs, *attrs.values()):
            if len(piece) > MAX_XML_ATTRIBUTE_CHARS:
                raise _Refused(
                    line,
                    f"<{_shown(tag)}>: a name or attribute value of {len(piece):,} characters "
                    f"(at most {MAX_XML_ATTRIBUTE_CHARS:,}): {_shown(piece)!r}",
                )
        element = XmlElement(tag, dict(attrs), line)
        (self.stack[-1].children if self.stack else self.roots).append(element)
        self.stack.append(element)

    def end(self, _tag: str) -> None:
        self.stack.pop()

    def comment(self, text: str) -> None:
        self.comments.append(text)

    def close(self) -> None:
        return None


def read_xml(text: str, source: str) -> XmlDocument:
    """Parse ``text`` safely, keeping element line numbers and comments.

    The parser is defusedxml's: a ``<!DOCTYPE`` (and so any entity declaration) or an external
    reference is refused where the parser meets it, so nothing is expanded and nothing outside
    the text is read. Elements nested deeper than :data:`MAX_XML_DEPTH` and attribute values
    longer than :data:`MAX_XML_ATTRIBUTE_CHARS` are refused as soon as the parser meets them, so
    the tree handed to the importer is bounded in depth.

    Parameters
    ----------
    text : str
        The document.
    source : str
        File name used in error messages.

    Returns
    -------
    XmlDocument

    Raises
    ------
    FormatError
        ``"SOURCE: line L: ..."`` for malformed XML, declarations, nesting too deep and
        attribute values too long.
    """
    target = _TreeTarget()
    parser = DefusedXMLParser(target=target, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    target.line_of = lambda: parser.parser.CurrentLineNumber
    try:
        parser.feed(text)
        parser.close()
    except ParseError as exc:
        line = exc.position[0]
        raise FormatError(f"{source}: line {line}: malformed XML: {str(exc).split(':', 1)[0]}") from None
    except DTDForbidden:
        raise FormatError(
            f"{source}: line {target.line_of()}: <!DOCTYPE ...> declarations are refused (no entity expansion, no external entities)"
        ) from None
    except DefusedXmlException as exc:  # entity declarations and external references
        raise FormatError(f"{source}: line {target.line_of()}: refused: {exc}") from None
    except _Refused as exc:
        raise FormatError(f"{source}: line {exc.line}: {exc.reason}") from None
    if not target.roots:
        raise FormatError(f"{source}: line 1: malformed XML: no element found")
    return XmlDocument(target.roots[0], tuple(target.comments))


def root_tag(text: str) -> str | None:
    """Name of the first element of ``text``, found without parsing (for format sniffing)."""
    match = re.search(r"<(?![!?/])\s*([A-Za-z_][\w.-]*)", _blank_comments(text))
    return match.group(1) if match else None
