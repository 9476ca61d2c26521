"""Read NCCL's topology dump (``NCCL_TOPO_DUMP_FILE``, the XML NCCL also reads from ``NCCL_TOPO_FILE``) into a
:class:`ServerGraph`.

The dump is a tree: ``<system>`` holds ``<cpu numaid=..>`` elements (NUMA nodes), which hold ``<pci busid class
link_speed link_width>`` elements (bridges and switches, class ``0x0604..``, nest); a ``<pci>`` holding ``<gpu dev
sm rank>`` is a GPU (its ``<nvlink target count>`` children are NVLink bonds to another GPU's bus id or to an
NVSwitch), a ``<pci>`` holding ``<nic>`` is a network card whose ``<net name speed>`` children are its ports
(``speed`` in Mb/s). A ``<nic>`` may also sit directly under a ``<cpu>``.

The server built from it: ``cpu{numaid}`` nodes joined by SMP links; a ``pcie{k}`` switch per bridge that has a GPU
or NIC below it; each GPU and NIC linked to its parent at its own ``link_speed x link_width``; NVLink bonds to
another GPU become direct links, bonds to anything else (NVSwitch chips) are summed into one link per GPU to a
single ``nvswitch`` node: the hardware spreads a GPU's traffic over all its NVLinks, while a route in the flow
model takes one path, so separate switch chips would cap a transfer at one chip's share.

The file is untrusted: it is parsed by ``defusedxml`` (no DTD, no entity declarations, no external references: an
entity bomb or a reference to a local file is refused, not expanded), at most :data:`MAX_XML_DEPTH` elements deep and
:data:`MAX_XML_ELEMENTS` elements in all, and every number it states is read finite, integral where it counts and
within the range a server can have (:data:`INT_RANGES`), refused with its file and line otherwise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from xml.etree.ElementTree import ParseError
from xml.parsers import expat

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from simulator.cluster.hostgraph import (
    NVLINK_LANE_BPS,
    NVLINK_LATENCY_S,
    PCIE_LATENCY_S,
    SMP_LATENCY_S,
    ImportOptions,
    Node,
    ServerGraph,
    nvlink_bandwidth,
    pcie_bandwidth,
)
from simulator.errors import InputError, excerpt

__all__ = ["INT_RANGES", "MAX_XML_DEPTH", "MAX_XML_ELEMENTS", "Element", "looks_like_xml", "nccl_xml_server",
           "parse_xml"]

MAX_XML_DEPTH = 64  # a real dump nests system > cpu > pci bridges > pci > gpu > nvlink: under 20 deep
MAX_XML_ELEMENTS = 100_000  # a real dump of an 8-GPU server has a few hundred
# integer attributes (element.attribute) -> the range a server can have: NUMA nodes and CUDA devices, CUDA compute
# capability x 10, NVLinks / xGMI links bonded to one target, PCIe lanes (x32 at most; 0 in virtual machines)
INT_RANGES: dict[str, tuple[int, int]] = {"cpu.numaid": (0, 4095), "gpu.dev": (0, 4095), "gpu.sm": (1, 10_000),
                                          "nvlink.count": (1, 64), "xgmi.count": (1, 64), "pci.link_width": (0, 32)}
MAX_GTS = 1024.0  # PCIe GT/s per lane (Gen7: 128)
MAX_NET_MBPS = 1e9  # a NIC port, Mb/s (1 Pb/s)

# CUDA compute capability (the dump's sm) -> (device spec, NVLink generation); Hopper covers H100/H200/H20/H800
_SM: dict[int, tuple[str | None, int]] = {60: (None, 1), 70: (None, 2), 80: ("a100-sxm", 3), 86: (None, 3),
                                         89: (None, 4), 90: ("h100-sxm", 4), 100: (None, 5)}
# RCCL dumps: AMD gfx target (gcn) -> (device spec, bytes/s per xGMI link per direction). MI300X: 7 Infinity Fabric
# links per GPU at 128 GB/s peak bidirectional each (AMD Instinct MI300X specifications; 64 GB/s per direction per
# pair, as the mi300x preset); MI250X: 100 GB/s peak per link (AMD Instinct MI250X specifications).
_GCN: dict[str, tuple[str | None, float]] = {"gfx942": ("mi300x", 64e9), "gfx90a": (None, 50e9)}
XGMI_LATENCY_S = 936e-9  # not published: the mi300x preset's assumption for one direct link
_GTS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


@dataclass
class Element:
    """An XML element with the line it starts on (ElementTree does not keep lines)."""

    tag: str
    attrs: dict[str, str]
    line: int
    children: list[Element] = field(default_factory=list)

    def need(self, key: str, src: str) -> str:
        if key not in self.attrs:
            raise InputError(f"<{self.tag}> has no {key!r} attribute", file=src, line=self.line,
                             field=f"{self.tag}.{key}")
        return self.attrs[key]

    def number(self, key: str, src: str) -> float:
        """A finite numeric attribute (decimal, or hex with ``0x``)."""
        raw = self.need(key, src)
        try:
            x = float(int(raw, 16)) if raw.lower().startswith("0x") else float(raw)
        except (ValueError, OverflowError):
            raise InputError(f"{key}={excerpt(raw)} is not a number", file=src, line=self.line,
                             field=f"{self.tag}.{key}") from None
        if not math.isfinite(x):
            raise InputError(f"{key}={excerpt(raw)} is not a finite number", file=src, line=self.line,
                             field=f"{self.tag}.{key}")
        return x

    def integer(self, key: str, src: str) -> int:
        """An integral attribute within :data:`INT_RANGES` of ``tag.key``."""
        x = self.number(key, src)
        low, high = INT_RANGES[f"{self.tag}.{key}"]
        if x != int(x) or not low <= x <= high:
            raise InputError(f"{key}={excerpt(self.attrs[key])}: expected an integer from {low} to {high}", file=src,
                             line=self.line, field=f"{self.tag}.{key}")
        return int(x)


def looks_like_xml(text: str) -> bool:
    return text.lstrip().startswith("<")


def parse_xml(text: str, src: str) -> Element:
    """Parse untrusted XML into :class:`Element` s (module docstring: no DTD, no entities, bounded depth and size); a
    malformed or refused document raises :class:`InputError` at the parser's line."""
    roots: list[Element] = []
    stack: list[Element] = []
    count = 0

    class Builder:  # the parser's target: an Element per start tag, with its line
        def start(self, tag: str, attrs: dict[str, str]) -> None:
            nonlocal count
            line = parser.parser.CurrentLineNumber
            count += 1
            if len(stack) >= MAX_XML_DEPTH:
                raise InputError(f"elements nested over {MAX_XML_DEPTH} deep (a topology dump nests under 20)",
                                 file=src, line=line, field="xml")
            if count > MAX_XML_ELEMENTS:
                raise InputError(f"over {MAX_XML_ELEMENTS:,} elements (a topology dump has hundreds)", file=src,
                                 line=line, field="xml")
            el = Element(tag, dict(attrs), line)
            (stack[-1].children if stack else roots).append(el)
            stack.append(el)

        def end(self, tag: str) -> None:
            stack.pop()

        def close(self) -> None:
            return None

    parser = DefusedXMLParser(target=Builder(), forbid_dtd=True, forbid_entities=True, forbid_external=True)
    try:
        parser.feed(text)
        parser.close()
    except ParseError as err:
        raise InputError(f"malformed XML: {expat.ErrorString(err.code)}", file=src, line=err.position[0],
                         field="xml") from None
    except DefusedXmlException as err:
        what = {"DTDForbidden": "a DTD (<!DOCTYPE>)", "EntitiesForbidden": "an entity declaration",
                "ExternalReferenceForbidden": "an external reference"}.get(type(err).__name__, "this construct")
        raise InputError(f"{what} is refused: untrusted XML is read without DTDs, entities or external references "
                         "(a topology dump has none)", file=src, line=parser.parser.CurrentLineNumber,
                         field="xml") from None
    root = roots[0]
    if root.tag != "system":
        raise InputError(f"not an NCCL topology: the root element is <{root.tag[:60]}>, expected <system>",
                         file=src, line=root.line, field="system")
    return root


@dataclass
class _Walk:
    src: str
    sg: ServerGraph
    opts: ImportOptions
    gpu_bus: dict[str, str] = field(default_factory=dict)  # bus id -> local gpu name
    gpu_el: dict[str, Element] = field(default_factory=dict)  # local gpu name -> <gpu>
    nics: list[tuple[str, Element, float]] = field(default_factory=list)  # (parent, <net>, pcie Bps)
    switches: int = 0


def nccl_xml_server(root: Element, src: str, opts: ImportOptions) -> ServerGraph:
    """Build the server described by an NCCL topology tree (see the module docstring for the rules)."""
    sg = ServerGraph(source=src, fmt="NCCL topology XML")
    w = _Walk(src, sg, opts)
    if opts.device:
        sg.notes.append(f"GPU model: {opts.device} (--device)")
    if opts.nvlink_gen:
        sg.notes.append(f"NVLink generation {opts.nvlink_gen} (--nvlink-gen)")
    cpus = [c for c in root.children if c.tag == "cpu"]
    if not cpus:
        raise InputError("no <cpu> element under <system>", file=src, line=root.line, field="system")
    seen: dict[str, int] = {}  # cpu name -> the line of its <cpu>
    for cpu in cpus:
        name = f"cpu{cpu.integer('numaid', src)}"
        if name in seen:
            raise InputError(f"two <cpu> elements with numaid={excerpt(cpu.attrs['numaid'])} (the first at line "
                             f"{seen[name]})", file=src, line=cpu.line, field="cpu.numaid")
        seen[name] = cpu.line
        sg.add_node(Node(name, "cpu", note=f"<cpu numaid={cpu.attrs['numaid']}> line {cpu.line}, "
                                           f"{cpu.attrs.get('vendor', '?')} {cpu.attrs.get('arch', '')}".rstrip()))
        for child in cpu.children:
            _walk(w, child, name, None)
    if not w.gpu_el:
        raise InputError("no <gpu> element in the topology", file=src, line=root.line, field="gpu")
    _add_nics(w)
    _nvlinks(w)
    _xgmi(w)
    gpus = sorted((n for n in sg.nodes if n.kind == "gpu"), key=lambda n: int(n.name[3:]))
    sg.nodes = gpus + [n for n in sg.nodes if n.kind != "gpu"]  # ranks in device order
    names = [n.name for n in sg.nodes if n.kind == "cpu"]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            sg.link(a, b, opts.smp_Bps, SMP_LATENCY_S, "smp", "socket to socket: not in the dump; assumed "
                                                              "(--smp-bandwidth)")
    return sg


def _pci_bw(w: _Walk, el: Element) -> tuple[float, str]:
    speed = el.need("link_speed", w.src)
    m = _GTS.match(speed)
    if not m:
        raise InputError(f"link_speed={excerpt(speed)}: expected a rate like '16.0 GT/s PCIe'", file=w.src,
                         line=el.line, field="pci.link_speed")
    width = el.integer("link_width", w.src)
    gts = float(m.group(1))
    if not 0 < gts <= MAX_GTS:
        raise InputError(f"link_speed={excerpt(speed)}: expected a rate above 0 and at most {MAX_GTS:g} GT/s",
                         file=w.src, line=el.line, field="pci.link_speed")
    if width == 0:
        return pcie_bandwidth(gts, 16), f"{gts:g} GT/s, link_width 0 (a virtual machine's): x16 assumed"
    return pcie_bandwidth(gts, width), f"{gts:g} GT/s x{width}"


def _walk(w: _Walk, el: Element, parent: str, up_bw: float | None) -> bool:
    """Add ``el`` (a ``<pci>`` or ``<nic>``) under ``parent``; return whether a GPU or NIC is below it."""
    if el.tag == "nic":
        for net in (c for c in el.children if c.tag == "net"):
            w.nics.append((parent, net, up_bw or 0.0))
        return any(c.tag == "net" for c in el.children)
    if el.tag != "pci":
        return False
    bw, how = _pci_bw(w, el)
    gpu = next((c for c in el.children if c.tag == "gpu"), None)
    if gpu is not None:
        name = f"gpu{gpu.integer('dev', w.src)}"
        if name in w.gpu_el:
            raise InputError(f"two GPUs with dev={gpu.attrs['dev']}", file=w.src, line=gpu.line, field="gpu.dev")
        w.gpu_bus[el.need("busid", w.src).lower()] = name
        w.gpu_el[name] = gpu
        device = _gpu_device(w, gpu)
        arch = f"gcn={gpu.attrs['gcn']}" if "gcn" in gpu.attrs else f"sm={gpu.attrs.get('sm')}"
        w.sg.add_node(Node(name, "gpu", device, note=f"<gpu dev={gpu.attrs.get('dev')} {arch}> "
                                                      f"at {el.attrs['busid']}, line {gpu.line}"))
        w.sg.link(name, parent, bw, PCIE_LATENCY_S, "pcie", f"{el.attrs['busid']}: {how}")
        return True
    if any(c.tag == "nic" for c in el.children):
        for nic in (c for c in el.children if c.tag == "nic"):
            _walk(w, nic, parent, bw)
        return True
    name = f"pcie{w.switches}"
    w.switches += 1
    mark = (len(w.sg.nodes), len(w.sg.links))
    w.sg.add_node(Node(name, "switch", note=f"PCIe bridge {el.attrs.get('busid', '?')}, line {el.line}"))
    below = [_walk(w, c, name, bw) for c in el.children]
    if not any(below):  # nothing of ours below: drop the bridge again
        del w.sg.nodes[mark[0]:]
        del w.sg.links[mark[1]:]
        w.switches -= 1
        return False
    w.sg.link(name, parent, bw, PCIE_LATENCY_S, "pcie", f"bridge {el.attrs.get('busid', '?')}: {how}")
    return True


def _gpu_device(w: _Walk, gpu: Element) -> str:
    if w.opts.device:
        return w.opts.device
    if "gcn" in gpu.attrs:
        what, device = f"gcn={gpu.attrs['gcn']}", _GCN.get(gpu.attrs["gcn"], (None, 0.0))[0]
    else:
        sm = gpu.integer("sm", w.src)
        what, device = f"sm={sm}", _SM.get(sm, (None, 0))[0]
    if device is None:
        raise InputError(f"no device spec is known for {what}; pass --device", file=w.src, line=gpu.line,
                         field=f"gpu.{what.split('=')[0]}")
    note = f"GPU model: {device}, assumed from {what} (the dump names no model; pass --device for another)"
    if note not in w.sg.notes:
        w.sg.notes.append(note)
    return device


def _add_nics(w: _Walk) -> None:
    wanted = w.opts.nics
    nets = {net.need("name", w.src): (parent, net, bw) for parent, net, bw in w.nics}
    if wanted is not None:
        for name in wanted:
            if name not in nets:
                raise InputError(f"no NIC {name!r} in {w.src}; NICs: {', '.join(nets)}", field="--nics")
        dropped = [n for n in nets if n not in wanted]
        if dropped:
            w.sg.notes.append(f"NICs left out (not in --nics): {', '.join(dropped)}")
    speeds = []
    for k, name in enumerate(wanted if wanted is not None else list(nets)):
        parent, net, bw = nets[name]
        mbps = net.number("speed", w.src)
        if not 0 <= mbps <= MAX_NET_MBPS:
            raise InputError(f"speed={excerpt(net.attrs['speed'])}: expected Mb/s from 0 to {MAX_NET_MBPS:g}",
                             file=w.src, line=net.line, field="net.speed")
        speed = mbps * 1e6 / 8  # Mb/s -> bytes/s
        speeds.append(speed)
        local = f"nic{k}"
        w.sg.add_node(Node(local, "nic", note=f"<net name={name} speed={net.attrs['speed']}> line {net.line}"))
        link_bw = bw or speed
        w.sg.link(local, parent, link_bw, PCIE_LATENCY_S, "pcie",
                  f"{name}: the card's PCIe link" if bw else f"{name}: no PCIe link in the dump, its port speed")
        w.sg.fabric_nics.append(local)
    if speeds:
        w.sg.nic_bandwidth_Bps = min(speeds)
        if len(set(speeds)) > 1:
            w.sg.notes.append(f"NIC speeds differ ({', '.join(f'{s * 8 / 1e9:g}' for s in speeds)} Gb/s): the "
                              "fabric uses the slowest")


def _nvlinks(w: _Walk) -> None:
    to_switch: dict[str, int] = {}
    pairs: dict[tuple[str, str], int] = {}
    gen = w.opts.nvlink_gen
    for name, gpu in w.gpu_el.items():
        if "gcn" in gpu.attrs:
            continue  # AMD: xGMI, below
        for nv in (c for c in gpu.children if c.tag == "nvlink"):
            target = nv.need("target", w.src).lower()
            count = nv.integer("count", w.src)
            if gen is None:
                gen = _SM.get(gpu.integer("sm", w.src), (None, 0))[1]
                if not gen:
                    raise InputError("the NVLink generation of this GPU is not known; pass --nvlink-gen",
                                     file=w.src, line=gpu.line, field="gpu.sm")
            if target in w.gpu_bus:
                pair = (min(name, w.gpu_bus[target]), max(name, w.gpu_bus[target]))
                pairs.setdefault(pair, count)
            else:
                to_switch[name] = to_switch.get(name, 0) + count
    if gen is None:
        return
    lane = NVLINK_LANE_BPS[gen] / 1e9
    if to_switch:
        w.sg.add_node(Node("nvswitch", "switch",
                           note="the NVSwitch chips the GPUs' <nvlink> targets name, as one node"))
        for name, count in to_switch.items():
            w.sg.link(name, "nvswitch", nvlink_bandwidth(gen, count), NVLINK_LATENCY_S, "nvlink",
                      f"sum of its <nvlink> counts to switches: {count} x NVLink{gen} at {lane:g} GB/s per direction")
    for (a, b), count in sorted(pairs.items()):
        w.sg.link(a, b, nvlink_bandwidth(gen, count), NVLINK_LATENCY_S, "nvlink",
                  f"<nvlink count={count}>: {count} x NVLink{gen} at {lane:g} GB/s per direction")


def _xgmi(w: _Walk) -> None:
    """RCCL's ``<xgmi target count>``: Infinity Fabric links between AMD GPUs (one link per bonded pair)."""
    pairs: dict[tuple[str, str], tuple[int, float, str]] = {}
    for name, gpu in w.gpu_el.items():
        for link in (c for c in gpu.children if c.tag == "xgmi"):
            gcn = gpu.attrs.get("gcn", "")
            if gcn not in _GCN:
                raise InputError(f"the Infinity Fabric link rate of gcn={gcn!r} is not known; known: "
                                 f"{', '.join(_GCN)}", file=w.src, line=gpu.line, field="gpu.gcn")
            target = link.need("target", w.src).lower()
            if target not in w.gpu_bus:
                raise InputError(f"xgmi target {target} is not a GPU of this dump", file=w.src, line=link.line,
                                 field="xgmi.target")
            pair = (min(name, w.gpu_bus[target]), max(name, w.gpu_bus[target]))
            pairs.setdefault(pair, (link.integer("count", w.src), _GCN[gcn][1], gcn))
    for (a, b), (count, rate, gcn) in sorted(pairs.items()):
        w.sg.link(a, b, count * rate, XGMI_LATENCY_S, "infinity-fabric",
                  f"<xgmi count={count}> of {gcn}: {count} x {rate / 1e9:g} GB/s per direction")
