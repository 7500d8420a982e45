"""Patched models inside Hugging Face pipelines and ``Trainer`` (tiny random models, offline)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizerFast,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    TrainingArguments,
    pipeline,
)

import attnprune
from attnprune.deploy.integrations import PruningTrainer, distillation_loss

WORDS = ["awful", "bad", "sad", "table", "chair", "door", "great", "happy", "good", "the", "it",
         "was", "very", "a", "movie", "day"]
TEXTS = ["it was a great day", "the movie was very very bad and the day was awful too",
         "a chair", "good good good it was a happy movie"]


@pytest.fixture(scope="module")
def bert_tok():
    # vocab= (a dict): in transformers 5, BertTokenizerFast(vocab_file=...) ignores the file
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})
    assert tok("a great movie").input_ids == [2, 18, 11, 19, 3]
    return tok


def tiny_bert(n_vocab: int, seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=n_vocab, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, num_labels=3,
                     initializer_range=0.3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg)


@pytest.fixture(scope="module")
def gpt_tok():
    """Character-level tokenizer: ids 0 = pad, 1 = eos, then a–z and space."""
    chars = ["<pad>", "<eos>", *"abcdefghijklmnopqrstuvwxyz ", "<unk>"]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=30, n_positions=64, n_embd=32, n_layer=4, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    return GPT2LMHeadModel(cfg)


def force_causal_pruning(model) -> None:
    """Decisive random LTP scorers, so that decision layers drop a good share of the tokens."""
    m = model.transformer.attnprune_method
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        m.w.copy_(torch.randn(m.w.shape, generator=g) * 2.0)
        m.b.zero_()
        m.tau.fill_(0.5)


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) of the prompts padded on the left, as generate() wants them."""
    L = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), L, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):], mask[i, L - len(p):] = p, 1
    return ids, mask


def scores(result) -> torch.Tensor:
    """Pipeline output for one text (a list of {label, score}) → scores ordered by label."""
    while isinstance(result, list) and len(result) == 1 and isinstance(result[0], list):
        result = result[0]
    return torch.tensor([r["score"] for r in sorted(result, key=lambda r: r["label"])])


# -- pipelines ------------------------------------------------------------------------------
CLASSIFY = [("entropy", {"keep_ratio": 0.5, "after_layer": 1}),
            ("attention_mass", {"keep_ratio": 0.5, "after_layer": 1}),
            ("ltp", {}), ("dtr", {}), ("entropy_gumbel", {"keep_ratio": 0.5}),
            ("crisp", {"sparsity": 0.5}), ("intensity", {})]


@pytest.mark.parametrize("method,options", CLASSIFY)
def test_text_classification_pipeline_batch_equals_single(bert_tok, method, options):
    model = tiny_bert(len(bert_tok)).eval()  # as from_pretrained returns it
    stock = [scores(r) for r in pipeline("text-classification", model=model, tokenizer=bert_tok,
                                         top_k=None)(TEXTS)]
    attnprune.patch(model, method, **options)
    assert not model.attnprune_method.training  # the method follows the model's eval mode
    pipe = pipeline("text-classification", model=model, tokenizer=bert_tok, top_k=None)
    single = [scores(pipe(t)) for t in TEXTS]
    batch = [scores(r) for r in pipe(TEXTS, batch_size=len(TEXTS))]  # padded to the longest
    for s, b in zip(single, batch):
        assert torch.allclose(s, b, atol=1e-5)
    # The pipeline ran the patched forward: its scores are the model's own, not the stock's.
    enc = bert_tok(TEXTS[1], return_tensors="pt")
    with torch.no_grad():
        direct = model(**enc).logits.softmax(-1)[0]
    assert torch.allclose(single[1], direct, atol=1e-5)
    if method not in ("dtr", "intensity"):  # fresh DTR keeps every token; intensity starts at 1
        assert max((s - t).abs().max() for s, t in zip(single, stock)) > 1e-3


def test_text_classification_pipeline_keep_all_equals_stock(bert_tok):
    model = tiny_bert(len(bert_tok)).eval()
    pipe = pipeline("text-classification", model=model, tokenizer=bert_tok, top_k=None)
    stock = [scores(r) for r in pipe(TEXTS, batch_size=2)]
    attnprune.patch(model, "attention_mass", keep_ratio=1.0, after_layer=1)
    pruned = [scores(r) for r in pipe(TEXTS, batch_size=2)]
    assert max((s - t).abs().max() for s, t in zip(pruned, stock)) < 1e-5


def test_text_generation_pipeline_batch_single_and_cache(gpt_tok):
    model = tiny_gpt2().eval()
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    force_causal_pruning(model)
    pipe = pipeline("text-generation", model=model, tokenizer=gpt_tok)
    prompts = ["hello world", "abc", "the quick brown fox jumps"]
    kw = {"max_new_tokens": 8, "do_sample": False}
    single = [pipe(p, **kw)[0]["generated_text"] for p in prompts]
    assert min(attnprune.patch_state(model).stats["kept_per_layer"]) < 1.0  # it pruned
    batch = [r[0]["generated_text"] for r in pipe(prompts, batch_size=3, **kw)]  # left-padded
    no_cache = [pipe(p, use_cache=False, **kw)[0]["generated_text"] for p in prompts]
    assert single == batch == no_cache
    assert all(len(s) > len(p) for s, p in zip(single, prompts))


@pytest.mark.parametrize("method", ["ltp", "dtr"])
def test_generate_cached_logits_match_full_recompute(method):
    """HF ``generate`` (KV cache, one-token decode steps, left-padded batch): every step's
    logits equal a forward of the whole prefix without a cache."""
    model = tiny_gpt2().eval()
    attnprune.patch(model, method, keep_ratio=0.5)
    if method == "ltp":
        force_causal_pruning(model)
    else:  # decisive random policies (hidden states are small: large first-layer weights)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for pol in model.transformer.attnprune_method.policies.values():
                pol.w1.weight.normal_(0, 20.0, generator=g)
                pol.w2.weight.normal_(0, 3.0, generator=g)
                pol.w2.bias.zero_()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 30, (n,), generator=g) for n in (5, 12, 20)]
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    pruned_any = False
    for i, p in enumerate(prompts):
        seq = torch.cat([p, out.sequences[i, L:]])[None]
        with torch.no_grad():
            full = model(seq, use_cache=False).logits[0]
        pruned_any |= min(attnprune.patch_state(model).stats["kept_per_layer"]) < 1.0
        for t, step in enumerate(out.logits):
            assert torch.allclose(step[i], full[len(p) - 1 + t], atol=1e-4), (i, t)
    assert pruned_any
    attnprune.patch_state(model).enabled = False
    with torch.no_grad():
        stock = model(seq, use_cache=False).logits[0]
    assert (stock - full).abs().max() > 1e-3  # pruning changed the logits


@pytest.mark.parametrize("method,options", [("crisp", {"sparsity": 0.5}), ("intensity", {})])
def test_generate_left_padded_batch_equals_single_with_attention_methods(method, options):
    """Position-aware intensity reads the ``position_ids`` generate() gives left-padded rows,
    so a row's logits do not depend on the padding in front of it."""
    model = tiny_gpt2().eval()
    attnprune.patch(model, method, **options)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # a decisive, position-dependent predictor
        for p in model.attnprune_method.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 3)
    prompts = [torch.randint(2, 30, (n,), generator=g) for n in (5, 12, 20)]
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    kw = {"max_new_tokens": 6, "do_sample": False, "output_logits": True,
          "return_dict_in_generate": True}
    batch = model.generate(ids, attention_mask=mask, **kw)
    for i, p in enumerate(prompts):
        one = model.generate(p[None], **kw)
        assert torch.equal(one.sequences[0, len(p):], batch.sequences[i, L:])
        for a, b in zip(one.logits, batch.logits):
            assert torch.allclose(a[0], b[i], atol=1e-5)


# -- Trainer --------------------------------------------------------------------------------
def classification_rows(tok, n: int = 24) -> list[dict]:
    rows = []
    for i in range(n):
        y = i % 3
        word = [["awful", "bad", "sad"], ["table", "chair", "door"], ["great", "happy", "good"]][y][i % 3]
        enc = tok(f"it was a very {word} movie" + " the day" * (i % 4))
        rows.append({**enc, "labels": y})
    return rows


def args(tmp_path, **kw) -> TrainingArguments:
    base = {"output_dir": str(tmp_path), "per_device_train_batch_size": 4, "num_train_epochs": 2,
            "learning_rate": 5e-2, "use_cpu": True, "report_to": [], "logging_steps": 2,
            "save_strategy": "no", "disable_tqdm": True, "seed": 0, "dataloader_num_workers": 0}
    base.update(kw)
    return TrainingArguments(**base)


def test_trainer_trains_ltp_with_aux_loss_and_checkpoints(bert_tok, tmp_path):
    model = tiny_bert(len(bert_tok))
    attnprune.patch(model, "ltp", keep_ratio=0.5)
    rows = classification_rows(bert_tok)
    trainer = PruningTrainer(model=model, args=args(tmp_path, save_strategy="steps", save_steps=6),
                             train_dataset=rows, data_collator=DataCollatorWithPadding(bert_tok))
    # The training loss is the task loss plus the method's aux loss of the same forward.
    batch = DataCollatorWithPadding(bert_tok)(rows[:4])
    model.train()
    loss = trainer.compute_loss(model, dict(batch))
    aux = attnprune.aux_loss(model)
    assert aux is not None and float(aux.detach()) > 0
    with torch.no_grad():
        task = model(**batch).loss
    assert torch.allclose(loss, task + aux, atol=1e-5)
    model.eval()  # evaluation: the task loss alone (of the hard-pruned forward)
    with torch.no_grad():
        assert torch.allclose(trainer.compute_loss(model, dict(batch)), model(**batch).loss)

    before = {k: v.clone() for k, v in model.state_dict().items() if "attnprune" in k}
    trainer.train()
    after = model.state_dict()
    assert not torch.equal(before["attnprune_method.theta"], after["attnprune_method.theta"])
    assert any("aux_loss" in h for h in trainer.state.log_history)

    # The Trainer's safetensors checkpoint holds the method; it resumes and reloads exactly.
    ckpt = tmp_path / "checkpoint-12"
    assert (ckpt / "model.safetensors").is_file()
    from safetensors.torch import load_file

    saved = load_file(ckpt / "model.safetensors")
    assert torch.equal(saved["attnprune_method.theta"], after["attnprune_method.theta"])
    fresh = tiny_bert(len(bert_tok), seed=5)
    attnprune.patch(fresh, "ltp", keep_ratio=0.5)
    fresh.load_state_dict(saved)
    model.eval(), fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(**batch).logits, model(**batch).logits)
    resumed = PruningTrainer(model=fresh, args=args(tmp_path, num_train_epochs=3),
                             train_dataset=rows, data_collator=DataCollatorWithPadding(bert_tok))
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == 18
    metrics = resumed.evaluate(eval_dataset=rows)  # eval: the hard-pruned forward's task loss
    assert math.isfinite(metrics["eval_loss"]) and "eval_aux_loss" not in metrics


def test_trainer_distils_from_a_teacher(bert_tok, tmp_path):
    teacher = tiny_bert(len(bert_tok), seed=1).eval()
    model = copy.deepcopy(teacher)
    attnprune.patch(model, "attention_mass", keep_ratio=0.5, after_layer=1)
    rows = classification_rows(bert_tok, 8)
    trainer = PruningTrainer(model=model, args=args(tmp_path), train_dataset=rows, teacher=teacher,
                             distill_weight=1.0, distill_temperature=2.0,
                             data_collator=DataCollatorWithPadding(bert_tok))
    batch = dict(DataCollatorWithPadding(bert_tok)(rows[:4]))
    model.train()
    loss = trainer.compute_loss(model, batch)
    with torch.no_grad():
        expected = distillation_loss(model(**batch).logits, teacher(**batch).logits, 2.0)
    assert float(expected) > 0  # pruning moved the student away from its full teacher
    assert torch.allclose(loss, expected, atol=1e-6)  # α = 1: the task loss has no weight
    trainer.train()
    assert any("distill_loss" in h for h in trainer.state.log_history)


def test_trainer_on_gpt2_with_gradient_accumulation(gpt_tok, tmp_path):
    """Causal LM: the Trainer passes ``num_items_in_batch`` to the model and normalises the
    task loss over the accumulated batch; the aux term is divided by the steps here."""
    from datasets import Dataset

    model = tiny_gpt2()
    attnprune.patch(model, "ltp", keep_ratio=0.3)
    texts = ["hello world", "abc def ghi", "the quick brown fox"] * 4
    # A datasets.Dataset with a text column: the Trainer drops the columns the model's
    # forward does not take (it reads the signature of the patched model's forward).
    data = Dataset.from_dict({"text": texts}).map(lambda r: gpt_tok(r["text"]))
    rows = [gpt_tok(t) for t in texts]
    collator = DataCollatorForLanguageModeling(gpt_tok, mlm=False)
    trainer = PruningTrainer(model=model, args=args(tmp_path, gradient_accumulation_steps=2,
                                                    num_train_epochs=1),
                             train_dataset=data, data_collator=collator)
    assert trainer.model_accepts_loss_kwargs
    batch = dict(collator(rows[:4]))
    model.train()
    n_items = int((batch["labels"][:, 1:] != -100).sum())
    trainer.current_gradient_accumulation_steps = 2
    loss = trainer.compute_loss(model, batch, num_items_in_batch=n_items)
    aux = attnprune.aux_loss(model)
    with torch.no_grad():
        task = model(**batch, num_items_in_batch=n_items).loss
    assert torch.allclose(loss, task + aux / 2, atol=1e-5)
    before = model.transformer.attnprune_method.tau.detach().clone()
    trainer.train()
    assert not torch.equal(before, model.transformer.attnprune_method.tau)
    # save_model (safetensors, tied embeddings) → a freshly patched model gives the same logits
    trainer.save_model(str(tmp_path / "final"))
    fresh = GPT2LMHeadModel.from_pretrained(tmp_path / "final")
    attnprune.patch(fresh, "ltp", keep_ratio=0.3)
    from safetensors.torch import load_file

    missing, unexpected = fresh.load_state_dict(load_file(tmp_path / "final" / "model.safetensors"),
                                                strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing)  # tied to wte
    model.eval(), fresh.eval()
    x = torch.tensor([gpt_tok("the quick brown fox jumps").input_ids])
    with torch.no_grad():
        assert torch.equal(fresh(x).logits, model(x).logits)


def test_distillation_loss():
    z = torch.randn(4, 3)
    assert float(distillation_loss(z, z, 2.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(distillation_loss(z, -z, 2.0)) > 0
    zt = torch.randn(2, 5, 7)
    zs = zt.clone()
    zs[:, 3:] += torch.randn(2, 2, 7)  # differs only at masked positions
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
    assert float(distillation_loss(zs, zt, 1.0, mask)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="teacher"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4), 1.0)


@pytest.mark.parametrize("bad,field", [({"distill_weight": 1.5}, "distill_weight"),
                                       ({"distill_temperature": 0}, "distill_temperature"),
                                       ({"aux_weight": -1}, "aux_weight"),
                                       ({"teacher": "bert"}, "teacher")])
def test_bad_trainer_options_name_the_field(bert_tok, tmp_path, bad, field):
    with pytest.raises(ValueError, match=field):
        PruningTrainer(model=tiny_bert(len(bert_tok)), args=args(tmp_path), **bad)
