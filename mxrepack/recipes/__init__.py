"""Per-target plans as data: one YAML file per target, shipped in this package.

A recipe says which layout the MoE experts take, what happens to the dense layers, and what the
output's ``config.json`` declares. Schema (every key checked; errors name the key)::

    name: sm121                      # the target name (``--target``)
    description: one line            # what it produces
    consumer: one line               # which kernel / engine reads it
    engine: vllm                     # the engine, for the model card
    experts:
      layout: flashinfer-cutlass     # a name from mxrepack.layouts.LAYOUTS
      options: {}                    # layout keyword options (optional)
    dense:
      format: mxfp4                  # bf16 (unchanged) | mxfp4 | mxfp8
      layers: [qkv, o, lm_head]      # which dense weights (mxrepack.quant.dense: keys, module names, re:REGEX)
      scale_rule: ocp                # ocp | compressed-tensors
      scale_search: false            # per group, try the scale one step up and keep the lower error
      scales: plain                  # plain [N, K/32] | swizzled (CUTLASS 128x4; pads N and K to 128)
      order: rows                    # MXFP4's byte order: rows (plain) | wgmma | mma2 (mxrepack's kernels only;
                                     # kept with format bf16 for --dense mxfp4)
    config:
      quantization_config: mxrepack  # remove | native | mxrepack | compressed-tensors
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from mxrepack.errors import MxRepackError

DENSE_FORMATS = ("bf16", "mxfp4", "mxfp8")
DENSE_ORDERS = ("rows", "wgmma", "mma2")  # mxrepack.layouts.dense.ORDERS
QUANT_CONFIG_MODES = ("remove", "native", "mxrepack", "compressed-tensors")
_SCHEMA = {
    "name": str,
    "description": str,
    "consumer": str,
    "engine": str,
    "experts": {"layout": str, "options": dict},
    "dense": {"format": str, "layers": list, "scale_rule": str, "scale_search": bool, "scales": str, "order": str},
    "config": {"quantization_config": str},
}
_REQUIRED = ("name", "description", "experts.layout", "dense.format", "config.quantization_config")


@dataclass(frozen=True)
class Recipe:
    name: str
    data: dict  # the validated YAML content
    source: str  # where it came from (file path or "builtin:NAME")

    @property
    def description(self) -> str:
        return self.data["description"]

    @property
    def consumer(self) -> str:
        return self.data.get("consumer", "")

    @property
    def engine(self) -> str:
        return self.data.get("engine", "")

    @property
    def expert_layout(self) -> str:
        return self.data["experts"]["layout"]

    @property
    def expert_options(self) -> dict:
        return dict(self.data["experts"].get("options") or {})

    @property
    def dense_format(self) -> str:
        return self.data["dense"]["format"]

    @property
    def dense_order(self) -> str:
        """The MXFP4 dense layers' byte order (mxrepack.layouts.dense.ORDERS); "rows" where they are not MXFP4."""
        layout = self.dense_layout
        return layout.order if layout is not None else "rows"

    @property
    def dense_layers(self) -> list[str]:
        from mxrepack.quant.dense import DEFAULT_LAYERS

        return list(self.data["dense"].get("layers") or DEFAULT_LAYERS)

    @property
    def dense_layout(self):
        """The DenseMxLayout for the quantized dense layers, or None when they stay BF16."""
        return _dense_layout(self.data["dense"])

    @property
    def quantization_config(self) -> str:
        return self.data["config"]["quantization_config"]

    def with_overrides(
        self,
        dense: str | None = None,
        dense_layers: str | None = None,
        scale_rule: str | None = None,
        scale_search: bool | None = None,
    ) -> "Recipe":
        """This recipe with the CLI's ``--dense``/``--dense-layers``/``--scale-rule``/``--scale-search``
        applied (validated like the file; the manifest records the result)."""
        from mxrepack.quant.dense import parse_layers

        data = copy.deepcopy(self.data)
        changes = {
            "format": dense,
            "layers": parse_layers(dense_layers) if dense_layers is not None else None,
            "scale_rule": scale_rule,
            "scale_search": scale_search,
        }
        if changes["layers"] == []:  # "" or ",": the recipe would record no layers and quantize the default ones
            raise MxRepackError(f"--dense-layers {dense_layers!r}: name at least one layer (e.g. qkv,o,lm_head)")
        changed = {k: v for k, v in changes.items() if v is not None}
        if not changed:
            return self
        data["dense"].update(changed)
        # they choose how dense layers are quantized (--no-scale-search asks nothing): with none quantized, nothing
        flags = {"layers": "--dense-layers", "scale_rule": "--scale-rule", "scale_search": "--scale-search"}
        unused = [flag for key, flag in flags.items() if changed.get(key)]
        if data["dense"]["format"] == "bf16" and unused:
            why = "--dense bf16 keeps" if dense == "bf16" else f"{self.name} keeps"
            raise MxRepackError(
                f"{'/'.join(unused)}: {why} the dense layers BF16; pass --dense mxfp4 (or mxfp8) to quantize them"
            )
        if data["dense"]["format"] == "mxfp8":
            data["dense"].pop("order", None)  # a byte order of MXFP4's (kept with bf16 for a later --dense mxfp4)
        if data["dense"]["format"] != "bf16" and data["config"]["quantization_config"] in ("native", "remove"):
            # A stock-loader config would make engines read quantized dense weights as BF16.
            data["config"]["quantization_config"] = "mxrepack"
        return Recipe(self.name, _check(data, f"{self.source} with command-line overrides"), self.source)


def _dense_layout(dense: dict):
    """A recipe's ``dense`` section -> DenseMxLayout (validating its values), or None for bf16."""
    from mxrepack.layouts.dense import DenseMxLayout

    if dense["format"] == "bf16":
        return None
    return DenseMxLayout(
        dense["format"],
        dense.get("scales", "plain"),
        dense.get("scale_rule", "ocp"),
        dense.get("scale_search", False),
        # MXFP4's byte order; outputs of `--dense mxfp8` on sm90-strided before 21c0cdf recorded the recipe's wgmma
        # beside mxfp8 (new recipes asking it are refused by _check), and still load
        dense.get("order", "rows") if dense["format"] == "mxfp4" else "rows",
    )


def _builtin_files() -> dict[str, Path]:
    folder = resources.files(__package__)
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def builtin_names() -> list[str]:
    return sorted(_builtin_files())


def _check(data: object, where: str) -> dict:
    from mxrepack.layouts import LAYOUTS, make_layout

    if not isinstance(data, dict):
        raise MxRepackError(f"recipe {where}: expected a mapping at the top level")

    def walk(node: dict, schema: dict, path: str) -> None:
        for key, value in node.items():
            full = f"{path}{key}"
            if key not in schema:
                raise MxRepackError(f"recipe {where}: key '{full}' is not known (valid here: {', '.join(schema)})")
            expected = schema[key]
            if isinstance(expected, dict):
                if not isinstance(value, dict):
                    raise MxRepackError(f"recipe {where}: key '{full}' must be a mapping")
                walk(value, expected, full + ".")
            elif not isinstance(value, expected):
                raise MxRepackError(f"recipe {where}: key '{full}' must be a {expected.__name__}, got {value!r}")

    walk(data, _SCHEMA, "")
    for req in _REQUIRED:
        node = data
        for part in req.split("."):
            if not isinstance(node, dict) or part not in node:
                raise MxRepackError(f"recipe {where}: key '{req}' is required")
            node = node[part]
    checks = [
        ("experts.layout", data["experts"]["layout"], sorted(LAYOUTS)),
        ("dense.format", data["dense"]["format"], DENSE_FORMATS),
        ("config.quantization_config", data["config"]["quantization_config"], QUANT_CONFIG_MODES),
    ]
    for key, value, valid in checks:
        if value not in valid:
            raise MxRepackError(f"recipe {where}: key '{key}': unknown value {value!r} (valid: {', '.join(valid)})")
    try:
        make_layout(data["experts"]["layout"], data["experts"].get("options"))
    except MxRepackError as e:
        raise MxRepackError(f"recipe {where}: key 'experts.options': {e}") from None
    dense = data["dense"]
    if dense.get("order", "rows") not in DENSE_ORDERS:
        raise MxRepackError(
            f"recipe {where}: key 'dense.order': unknown value {dense['order']!r} (valid: {', '.join(DENSE_ORDERS)})"
        )
    if dense.get("order", "rows") != "rows" and dense["format"] == "mxfp8":
        raise MxRepackError(f"recipe {where}: dense.order {dense['order']} is a byte order of MXFP4's, not of mxfp8")
    if dense["format"] != "bf16":
        from mxrepack.quant.dense import layer_pattern

        try:
            _dense_layout(dense)
            for entry in dense.get("layers") or []:
                layer_pattern(str(entry))
        except MxRepackError as e:
            raise MxRepackError(f"recipe {where}: {e}") from None
        if dense.get("order", "rows") != "rows" and data["config"]["quantization_config"] != "mxrepack":
            raise MxRepackError(
                f"recipe {where}: dense.order {dense['order']} is read by mxrepack's kernels only: it needs "
                "config.quantization_config mxrepack"
            )
        if data["config"]["quantization_config"] in ("native", "remove"):
            raise MxRepackError(
                f"recipe {where}: dense.format {dense['format']} needs config.quantization_config "
                "mxrepack or compressed-tensors (a stock mxfp4 or no config would load the "
                "quantized dense weights as BF16)"
            )
    return data


def load_recipe(target: str | None = None, path: str | Path | None = None) -> Recipe:
    """A built-in recipe by target name, or a user recipe file (``--recipe FILE``); not both."""
    if path is not None and target is not None:  # the file would silently win over the target
        raise MxRepackError(f"--target {target} and --recipe {path}: pass one (the recipe file names its own target)")
    if path is not None:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise MxRepackError(f"recipe {p}: file does not exist") from None
        except OSError as e:  # a folder, no permission
            raise MxRepackError(f"recipe {p}: cannot read it ({e.strerror or e}); expected a YAML file") from None
        except UnicodeDecodeError as e:
            raise MxRepackError(f"recipe {p}: not UTF-8 text (byte {e.start}); expected a YAML file") from None
        except yaml.YAMLError as e:
            raise MxRepackError(f"recipe {p}: not valid YAML ({str(e).splitlines()[0]})") from None
        data = _check(data, str(p))
        return Recipe(data["name"], data, str(p))
    files = _builtin_files()
    if target not in files:
        raise MxRepackError(f"unknown target {target!r}; valid targets: {', '.join(sorted(files))}")
    data = _check(yaml.safe_load(files[target].read_text()), f"{target}.yaml")
    return Recipe(data["name"], copy.deepcopy(data), f"builtin:{target}")


def list_recipes() -> list[Recipe]:
    return [load_recipe(name) for name in builtin_names()]
