"""The named setups of the documentation's examples, shared by the tests that run them as written.

A Markdown block of README.md or docs/ names them with ``<!-- snippet: uses NAME -->`` (tests/test_docs.py); a
docstring ``>>>`` example of the package is given them by the table in tests/test_docstring_examples.py. Each
setup defines, in the namespace the example runs in, the names its docstring lists.
"""

from __future__ import annotations

from collections.abc import Callable

# Setups: each defines, in the page's namespace, the names its docstring lists. Models are tiny and random
# (built from configs, no download), texts come from the shipped data, tokenizers are the shipped ones.
SETUPS: dict[str, Callable[[dict], None]] = {}


def setup(function: Callable[[dict], None]) -> Callable[[dict], None]:
    SETUPS[function.__name__] = function
    return function


def _minilm_tokenizer():
    import transformers as T

    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())  # the bert-base-uncased vocabulary


def _gpt2_tokenizer():
    import transformers as T

    from bcos_plugins.data import shipped_data

    return T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))


def _sst2(n: int) -> tuple[list[str], list[int]]:
    from bcos_plugins.data import load_sst2

    rows = load_sst2(n=n)
    return rows.texts, rows.labels


def _tiny_bert(model_class: str, vocab_size: int, num_labels: int = 2, layers: int = 2):
    import torch
    import transformers as T

    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=128, num_labels=num_labels)
    return getattr(T, model_class)(config).eval()


def _tiny_gpt2_config(vocab_size: int):
    import transformers as T

    return T.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64)


def _tiny_gpt2(vocab_size: int):
    import torch
    import transformers as T

    torch.manual_seed(0)
    return T.GPT2LMHeadModel(_tiny_gpt2_config(vocab_size)).eval()


def _tiny_llama(vocab_size: int, **overrides):
    import torch
    import transformers as T

    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64, **overrides)
    return T.LlamaForCausalLM(config).eval()


@setup
def bert_base_uncased_folder(namespace: dict) -> None:
    """./bert-base-uncased: a tiny random BERT with the bert-base-uncased vocabulary (the shipped MiniLM
    tokenizer's), so that ``from_pretrained("bert-base-uncased")`` loads it from the current folder, offline."""
    _tiny_bert("BertModel", 30522).save_pretrained("bert-base-uncased")
    _minilm_tokenizer().save_pretrained("bert-base-uncased")


@setup
def gpt2_folder(namespace: dict) -> None:
    """./gpt2: a tiny random GPT-2 with the shipped GPT-2 tokenizer, so that ``from_pretrained("gpt2")`` loads them
    from the current folder, offline."""
    tokenizer = _gpt2_tokenizer()
    _tiny_gpt2(len(tokenizer)).save_pretrained("gpt2")
    tokenizer.save_pretrained("gpt2")


@setup
def bcos_bert(namespace: dict) -> None:
    """``bcos_bert`` and ``bcos_model`` (one tiny B-cos BERT sentiment classifier), its ``tokenizer``, two SST-2
    sentences as ``input_ids`` / ``attention_mask``, and ``explanation`` (``explain`` of them)."""
    from bcos_plugins import bcosify, explain

    tokenizer = _minilm_tokenizer()
    model = bcosify(_tiny_bert("BertForSequenceClassification", len(tokenizer)), b=1.5, verbose=False)
    encoded = tokenizer(_sst2(2)[0], padding=True, return_tensors="pt")
    namespace.update(bcos_bert=model, bcos_model=model, tokenizer=tokenizer, input_ids=encoded["input_ids"],
                     attention_mask=encoded["attention_mask"],
                     explanation=explain(model, encoded["input_ids"], encoded["attention_mask"]))


@setup
def bcos_bert_batch(namespace: dict) -> None:
    """``model``: a tiny B-cos BERT classifier; ``batch``: its tokenizer's padded output for two SST-2 sentences."""
    from bcos_plugins import bcosify

    tokenizer = _minilm_tokenizer()
    model = bcosify(_tiny_bert("BertForSequenceClassification", len(tokenizer)), b=1.5, verbose=False)
    namespace.update(model=model, batch=tokenizer(_sst2(2)[0], padding=True, return_tensors="pt"))


@setup
def bcos_gpt2(namespace: dict) -> None:
    """``bcos_gpt2``: a tiny B-cos GPT-2 LM (B = 1.1) over the shipped GPT-2 tokenizer, ``tokenizer`` / ``tok``."""
    from bcos_plugins import bcosify

    tokenizer = _gpt2_tokenizer()
    namespace.update(bcos_gpt2=bcosify(_tiny_gpt2(len(tokenizer)), b=1.1, verbose=False), tokenizer=tokenizer,
                     tok=tokenizer)


@setup
def bcos_llama(namespace: dict) -> None:
    """``bcos_llama``: a tiny B-cos Llama LM; ``ids``: two rows of token ids; ``next_token_ids``: a target per row."""
    import torch

    from bcos_plugins import bcosify

    model = bcosify(_tiny_llama(60), b=1.1, verbose=False)
    namespace.update(bcos_llama=model, ids=torch.randint(3, 60, (2, 7)), next_token_ids=torch.tensor([5, 9]))


@setup
def gpt2_training(namespace: dict) -> None:
    """``config``: a tiny ``GPT2Config`` (shipped GPT-2 tokenizer's vocabulary), ``tok``; ``tokenised_rows``:
    16 TinyStories-like sentences as ``{"input_ids": [...]}``; ``ids`` / ``mask``: two right-padded prefixes;
    ``good_ids`` / ``bad_ids``: a grammatical and an ungrammatical next token per prefix."""
    tok = _gpt2_tokenizer()
    tok.pad_token = tok.eos_token
    sentences = [f"Once upon a time there was a {animal} who liked to {verb}."
                 for animal in ("cat", "dog", "bird", "fish") for verb in ("run", "sing", "swim", "play")]
    encoded = tok(["The keys to the cabinet", "The dog"], padding=True, return_tensors="pt")
    good, bad = tok([" are", " is"])["input_ids"], tok([" is", " are"])["input_ids"]
    namespace.update(config=_tiny_gpt2_config(len(tok)), tok=tok,
                     tokenised_rows=[{"input_ids": tok(s)["input_ids"]} for s in sentences],
                     ids=encoded["input_ids"], mask=encoded["attention_mask"],
                     good_ids=[row[0] for row in good], bad_ids=[row[0] for row in bad])


@setup
def hf_gpt2(namespace: dict) -> None:
    """``hf_gpt2_or_llama``: a tiny stock transformers GPT-2 LM; ``tok``: the shipped GPT-2 tokenizer; ``tokens``:
    one prompt's ids; ``t`` / ``f``: a target and a foil token id."""
    tok = _gpt2_tokenizer()
    namespace.update(hf_gpt2_or_llama=_tiny_gpt2(len(tok)), tok=tok,
                     tokens=tok(["When Mary and John went to the store, John gave a drink to"],
                                return_tensors="pt")["input_ids"],
                     t=tok(" Mary")["input_ids"][0], f=tok(" John")["input_ids"][0])


def _sae(d_in: int, d_sae: int, hook_name: str, *, k: int | None = None, seed: int = 0):
    """A random sae-lens SAE (TopK when ``k`` is given) reading at ``hook_name``, weights set from tensors."""
    import torch
    from sae_lens import StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    metadata = SAEMetadata(hook_name=hook_name)
    sae = (TopKSAE(TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=k, metadata=metadata)) if k is not None
           else StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=d_sae, metadata=metadata)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return sae


@setup
def bilinear_llama(namespace: dict) -> None:
    """``bilinear_llama``: a tiny transformers Llama LM with ``hidden_act="linear"`` (bilinear MLPs), width 16."""
    namespace["bilinear_llama"] = _tiny_llama(60, hidden_act="linear")


@setup
def bilinear_lens_model(namespace: dict) -> None:
    """``model``: a tiny bilinear TransformerLens model (``bilinear_config``), width 16."""
    import torch
    from bcos_plugins.adapters.transformer_lens import bilinear_config
    from transformer_lens import HookedTransformer

    torch.manual_seed(0)
    namespace["model"] = HookedTransformer(bilinear_config(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=60,
                                                           n_ctx=16))


@setup
def bilinear_saes(namespace: dict) -> None:
    """``sae_in`` / ``sae_out``: TopK SAEs (width 48) on block 1's MLP input and output of a width-16 model;
    ``feature`` / ``features``: output feature ids; ``mlp_inputs``: 64 random MLP inputs (width 16)."""
    import torch

    namespace.update(sae_in=_sae(16, 48, "blocks.1.ln2.hook_normalized", k=6, seed=1),
                     sae_out=_sae(16, 48, "blocks.1.hook_mlp_out", k=8, seed=2),
                     feature=3, features=[0, 1, 2], mlp_inputs=torch.randn(64, 16))


@setup
def bcos_lens_model_and_sae(namespace: dict) -> None:
    """``model``: a tiny explainable B-cos ``HookedSAETransformer`` (from a B-cos GPT-2, width 32); ``tokens``: two
    rows of ids; ``sae``: a standard SAE of 128 features reading ``blocks.1.hook_resid_pre`` (not attached)."""
    import torch
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from sae_lens import HookedSAETransformer

    from bcos_plugins import bcosify

    model = hooked_transformer_from_hf(bcosify(_tiny_gpt2(60), b=1.5, verbose=False), model_class=HookedSAETransformer)
    namespace.update(model=model, tokens=torch.randint(3, 60, (2, 8)), sae=_sae(32, 128, "blocks.1.hook_resid_pre"))


@setup
def sae_model(namespace: dict) -> None:
    """``sae_model``: a tiny explainable B-cos ``HookedSAETransformer`` with an SAE spliced in at
    ``blocks.0.hook_resid_post`` (``use_error_term=True``); ``tokens``: two rows of ids; ``t``: a target id."""
    import torch
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from sae_lens import HookedSAETransformer

    from bcos_plugins import bcosify

    model = hooked_transformer_from_hf(bcosify(_tiny_gpt2(60), b=1.5, verbose=False), model_class=HookedSAETransformer)
    model.add_sae(_sae(32, 128, "blocks.0.hook_resid_post"), use_error_term=True)
    namespace.update(sae_model=model, tokens=torch.randint(3, 60, (2, 8)), t=4)


@setup
def images(namespace: dict) -> None:
    """``images``: four random 16x16 grey images in [0, 1]."""
    import torch

    namespace["images"] = torch.rand(4, 1, 16, 16)


@setup
def digits(namespace: dict) -> None:
    """``x_train`` / ``x_test`` (float, 64 pixels in [0, 1]) and ``y_train`` / ``y_test``: scikit-learn's 8x8
    digits (bundled with scikit-learn), split 1,500 / 297."""
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target)
    namespace.update(x_train=x[:1500], x_test=x[1500:], y_train=y[:1500], y_test=y[1500:])


@setup
def bilinear_digits_layer(namespace: dict) -> None:
    """``layer``: a random bias-free ``BilinearMLP`` from 64 pixels to 10 digit logits (256 hidden units)."""
    import torch

    from bcos_plugins.bilinear import BilinearMLP

    torch.manual_seed(0)
    namespace["layer"] = BilinearMLP(64, 256, 10, bias=False)


@setup
def space_inputs(namespace: dict) -> None:
    """``path``: a folder holding a tiny random BERT and the MiniLM tokenizer (``tokenizer``); ``input_ids`` /
    ``attention_mask`` / ``y``: four SST-2 sentences and labels; ``d``: a folder name to save to;
    ``rt_texts`` / ``rt_labels``: 8 shipped rt_polarity reviews."""
    import torch

    from bcos_plugins.data import shipped_data
    from bcos_plugins.space import read_rt_polarity

    tokenizer = _minilm_tokenizer()
    _tiny_bert("BertModel", len(tokenizer)).save_pretrained("tiny-bert")
    tokenizer.save_pretrained("tiny-bert")
    texts, labels = _sst2(4)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    rt_texts, rt_labels = read_rt_polarity(shipped_data("rt_polarity"), limit_per_class=4)
    namespace.update(path="tiny-bert", tokenizer=tokenizer, input_ids=encoded["input_ids"],
                     attention_mask=encoded["attention_mask"], y=torch.tensor(labels), d="space-model",
                     rt_texts=rt_texts, rt_labels=rt_labels)


@setup
def guided_inputs(namespace: dict) -> None:
    """``model``: a tiny stock BERT NLI classifier (4 layers, 3 classes) in training mode, ``tokenizer`` (MiniLM's);
    ``p`` / ``h``: two premise / hypothesis pairs, ``spans``: each premise's rationale as character spans;
    ``batch``: the tokenised pairs, ``y``: their labels."""
    import torch

    tokenizer = _minilm_tokenizer()
    model = _tiny_bert("BertForSequenceClassification", len(tokenizer), num_labels=3, layers=4).train()
    p = ["A man is playing a guitar on stage.", "Two dogs run through a snowy field."]
    h = ["A man performs music.", "The dogs are asleep."]
    spans = [[(8, 25)], [(10, 34)]]
    namespace.update(model=model, tokenizer=tokenizer, p=p, h=h, spans=spans, y=torch.tensor([0, 2]),
                     batch=tokenizer(p, h, padding=True, return_tensors="pt"))


@setup
def recipe_inputs(namespace: dict) -> None:
    """``path``: a folder holding a tiny random BERT (with pooler) and the MiniLM tokenizer, ``tok``;
    ``texts`` / ``labels``: 16 SST-2 sentences; ``unlabelled_texts``: 16 more; ``stock_model`` and
    ``conventional_model``: tiny stock BERT sentiment classifiers."""
    tok = _minilm_tokenizer()
    _tiny_bert("BertModel", len(tok)).save_pretrained("tiny-bert")
    tok.save_pretrained("tiny-bert")
    texts, labels = _sst2(32)
    namespace.update(path="tiny-bert", tok=tok, texts=texts[:16], labels=labels[:16], unlabelled_texts=texts[16:],
                     stock_model=_tiny_bert("BertForSequenceClassification", len(tok)),
                     conventional_model=_tiny_bert("BertForSequenceClassification", len(tok)))
