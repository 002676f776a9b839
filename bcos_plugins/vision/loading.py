"""Loading the vision models with ``from_pretrained``: a folder that lacks a weight is refused, not filled."""

from __future__ import annotations

from ..errors import BcosValueError, argument_error

__all__ = ["WholeCheckpointLoading"]


class WholeCheckpointLoading:
    """Mixin of the vision ``PreTrainedModel`` classes (listed before ``PreTrainedModel``): ``from_pretrained``
    refuses a folder that lacks a weight the model needs (transformers would fill it with random values and only
    list it in its load report), holds weights the model does not use, or holds weights of another shape."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, output_loading_info: bool = False,
                        **kwargs):
        """transformers' ``from_pretrained``, with every weight required. Only ``bcos_b`` may be missing: a
        BcosViT saved before every layer stored its B runs at ``config.b``. ``load_bcos_model`` loads a BcosViT
        folder through this method.

        Raises:
            BcosValueError: naming the missing, unexpected and mismatched weights.
        """
        _refuse_keywords_of_another_model(cls, pretrained_model_name_or_path, kwargs)
        try:
            model, info = super().from_pretrained(pretrained_model_name_or_path, *model_args, output_loading_info=True,
                                                  **kwargs)
        except RuntimeError as err:
            # a shape keyword (max_out=1, image_size=16, num_labels=3) failed with transformers' "You set
            # `ignore_mismatched_sizes` to `False`", which named neither the keyword nor the fix
            # (with config= the caller builds the model: load_bcos_model quotes transformers' report itself)
            if "ignore_mismatched_sizes" not in str(err) or kwargs.get("config") is not None:
                raise
            given = sorted(k for k in kwargs if hasattr(cls.config_class(), k))
            raise BcosValueError(
                f"path: {pretrained_model_name_or_path} holds weights of other shapes than the {cls.__name__} "
                f"{'these keywords build: ' + str(given) if given else 'its config builds'} (transformers' load report "
                "above lists them). " + ("Leave the shape keywords out to load the model as saved" if given else
                                         "Load the folder with the class that saved it (its config.json's "
                                         "architectures)")) from None
        missing = [k for k in info["missing_keys"] if not k.endswith("bcos_b")]
        if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
            raise BcosValueError(
                f"path: {pretrained_model_name_or_path} does not hold a whole {cls.__name__}: missing "
                f"{sorted(missing)}, unexpected {sorted(info['unexpected_keys'])}, mismatched "
                f"{info.get('mismatched_keys')} (the missing weights would be random). Restore the folder from the "
                "original save_pretrained.")
        _refuse_an_overridden_b(model, kwargs.get("b"))
        if kwargs.get("config") is not None and "b" not in kwargs:
            _refuse_another_configs_b(cls, model, pretrained_model_name_or_path, kwargs)
        return (model, info) if output_loading_info else model


# config fields that change what the saved weights compute, without changing any weight's shape (b has its own check)
_COMPUTATION_FIELDS = ("layer_norm_eps", "logit_scale")


def _refuse_keywords_of_another_model(cls, path, kwargs) -> None:
    """``from_pretrained(folder, logit_scale=5.0)`` or ``layer_norm_eps=0.5`` (or a ``config=`` that says so, as
    ``load_bcos_model(folder, logit_scale=5.0)`` passes it) loaded the saved weights into another model (every logit 5x
    the saved one's, every norm another), silently: the weights fit, so nothing was reported (as ``load_bcos_model``
    refuses a text model's ``layer_norm_eps=``)."""
    config = kwargs.get("config")
    given = {k: kwargs[k] for k in _COMPUTATION_FIELDS if k in kwargs}
    if config is not None:
        given.update({k: getattr(config, k) for k in _COMPUTATION_FIELDS if k not in given and hasattr(config, k)})
    if not given:
        return
    saved, _ = cls.config_class.get_config_dict(path, **{k: kwargs[k] for k in _CONFIG_LOCATION if k in kwargs})
    defaults = cls.config_class()
    for key, value in given.items():
        before = saved.get(key, getattr(defaults, key))  # (a config saved as a diff leaves defaults out)
        if value != before:
            name, said = (key, f"from_pretrained(..., {key}={value!r})") if key in kwargs else \
                (f"config.{key}", f"the config passed (or a keyword of load_bcos_model) says {key}={value!r}, which")
            raise argument_error(name, f"{said} loads the saved weights into another model: they were saved with "
                                 f"{key}={before!r}, and the logits would be another model's", f"Leave {key} out to "
                                 f"load the model as saved; to change it, set model.config.{key} after loading, "
                                 "knowing the model changes with it")


def _refuse_an_overridden_b(model, requested) -> None:
    """``from_pretrained(folder, b=2.0)`` set ``config.b`` to 2.0 while every layer ran at the B its checkpoint
    stores (a loaded ``bcos_b`` is left alone): the model said one B and explained with another, silently."""
    if requested is None:
        return
    stored = sorted({float(m.b) for m in model.modules() if hasattr(m, "bcos_b")})
    if stored and stored != [float(requested)]:
        raise argument_error("b", f"from_pretrained(..., b={requested}) does not change a saved model's B: the "
                             f"checkpoint stores each layer's B ({stored}) and those run, while config.b would say "
                             f"{requested}", "Leave b out to load the model as saved; to change B, set it on each "
                             "B-cos layer after loading (for m in model.modules(): if hasattr(m, 'bcos_b'): m.b = "
                             f"{requested}) and set model.config.b = {requested}")


# the keywords of from_pretrained that say where the saved config.json is (besides the path)
_CONFIG_LOCATION = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


def _refuse_another_configs_b(cls, model, path, kwargs) -> None:
    """``from_pretrained(folder, config=cfg)`` with a ``cfg.b`` other than the B every layer stores gave a config that
    said one B while the layers ran at another (only ``b=`` was refused), silently. A config whose B is the folder's
    own saved ``config.b`` loads: a checkpoint saved mid-way through a B warm-up stores each layer's current B while
    its config keeps the target (``BWarmupCallback``), and must reload as saved."""
    stored = sorted({float(m.b) for m in model.modules() if hasattr(m, "bcos_b")})
    given = float(model.config.b)
    if not stored or stored == [given]:
        return
    saved, _ = cls.config_class.get_config_dict(path, **{k: kwargs[k] for k in _CONFIG_LOCATION if k in kwargs})
    if saved.get("b") is not None and float(saved["b"]) == given:
        return  # the folder's own config (mid-way through a B warm-up)
    raise argument_error("config", f"says b={given}, but the checkpoint stores each layer's B ({stored}) and those run, "
                         "so the loaded config.b would describe another B than the explanations come from",
                         f"Pass a config with b = {stored[0]} (config.b = {stored[0]}), or leave config out to load the "
                         "folder's own; to change B, set it on each B-cos layer after loading (for m in "
                         f"model.modules(): if hasattr(m, 'bcos_b'): m.b = {given}) and set model.config.b = {given}")
