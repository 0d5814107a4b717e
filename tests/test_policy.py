"""Policy layer on a real tiny Qwen2 model with a locally trained tokenizer (no mocks)."""
from __future__ import annotations

import json

import pytest
import torch

from envs.base import Observation
from milegpo_cli.policy import (Policy, PolicyError, TinyModelError, candidate_logprobs, parse_action,
                                project_action, token_logprobs)
from milegpo_cli.policy.actions import candidate_distribution
from milegpo_cli.policy.prompts import encode_prompt

torch.set_num_threads(1)

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=400)
CORPUS = [
    "You are in the middle of a room. Looking quickly around you, you see a countertop 1, a fridge 1, a microwave 1.",
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a knife 2, a mug 3.",
    "Your task is to: put a hot apple in fridge.",
    "go to fridge 1", "open fridge 1", "take apple 1 from countertop 1", "heat apple 1 with microwave 1",
    "move apple 1 to fridge 1", "examine countertop 1", "look", "inventory",
]
ADMISSIBLE = ("go to fridge 1", "go to fridge 10", "open fridge 1", "take apple 1 from countertop 1", "look",
              "inventory", "go to countertop 1", "heat apple 1 with microwave 1", "examine countertop 1",
              "move apple 1 to fridge 1")


def obs(n: int, text: str = "You arrive at countertop 1. On the countertop 1, you see a apple 1.") -> Observation:
    return Observation(text, "Your task is to: put a hot apple in fridge.", ADMISSIBLE[:n], f"state-{n}")


def make_cfg(**kw):
    cfg = dict(model="tiny", action_mode="score", history=2, max_prompt_tokens=256, max_new_tokens=16,
               temperature=1.0, lora=False, tiny=TINY)
    cfg.update(kw)
    return cfg


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def score_policy(cache):
    return Policy.from_config(make_cfg(), CORPUS, cache, "cpu")


@pytest.mark.parametrize("norm", ["sum", "mean"])
def test_score_probabilities_sum_to_one(cache, norm):
    policy = Policy.from_config(make_cfg(score_norm=norm), CORPUS, cache, "cpu")
    observations = [obs(3), obs(10), obs(1)]
    out = policy.act(observations, [[], [("You see a fridge 1.", "look")], []], [0, 1, 0])
    for o, a in zip(observations, out):
        s = a.sample
        with torch.no_grad():
            seq = candidate_logprobs(policy.model, [s.prompt_ids], [s.candidate_ids])[0]
        lengths = [len(c) for c in s.candidate_ids] if norm == "mean" else None
        dist = candidate_distribution(seq, 1.0, lengths)
        assert dist.exp().sum().item() == pytest.approx(1.0, abs=1e-6)
        assert len(dist) == len(o.admissible)
        assert a.action == o.admissible[s.chosen]
        assert a.logp == pytest.approx(float(dist[s.chosen]), abs=1e-5)
    assert out[2].logp == pytest.approx(0.0, abs=1e-6)  # single admissible action: probability 1


def test_temperature_and_greedy(score_policy):
    o = [obs(10)]
    greedy = score_policy.act(o, [[]], [0], greedy=True)[0]
    s = greedy.sample
    with torch.no_grad():
        seq = candidate_logprobs(score_policy.model, [s.prompt_ids], [s.candidate_ids])[0]
    assert s.chosen == int(seq.argmax())
    entropy = [float(-(d.exp() * d).sum()) for d in (candidate_distribution(seq, t) for t in (0.5, 1.0, 4.0))]
    assert entropy[0] < entropy[1] < entropy[2]


def test_kv_cache_scoring_equals_padded_batch(cache):
    score_policy = Policy.from_config(make_cfg(), CORPUS, cache, "cpu")
    with torch.no_grad():  # sharpen attention so that a wrong position or mask would show (init is near uniform)
        for name, p in score_policy.model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(30.0)
    observations = [obs(10), obs(4, "You are in the middle of a room."), obs(7)]
    histories = [[], [("You see a fridge 1.", "look"), ("Nothing happens.", "inventory")], [("a", "look")]]
    prompts = [score_policy.encode(o, h, len(h)) for o, h in zip(observations, histories)]
    assert len({len(p) for p in prompts}) == 3  # different prompt lengths exercise the padding
    cands = [[score_policy.candidate_ids(a) for a in o.admissible] for o in observations]
    with torch.no_grad():
        kv = candidate_logprobs(score_policy.model, prompts, cands, score_policy.pad_id)
        for p, cs, got in zip(prompts, cands, kv):
            logp, _, row = token_logprobs(score_policy.model, [p] * len(cs), cs, 1.0, score_policy.pad_id)
            padded = torch.zeros(len(cs)).index_add_(0, row, logp)
            assert torch.allclose(got, padded, rtol=0.0, atol=1e-4), (got - padded).abs().max()


def test_candidates_end_with_eos_so_prefixes_differ(score_policy):
    a, b = score_policy.candidate_ids("go to fridge 1"), score_policy.candidate_ids("go to fridge 10")
    assert a[-1] == b[-1] == score_policy.eos_id and a != b[: len(a)]


def test_prompt_follows_convention_and_truncates(score_policy):
    history = [(f"observation number {i}", "look") for i in range(6)]
    gen = Policy(score_policy.model, score_policy.tokenizer, make_cfg(action_mode="generate", max_prompt_tokens=2048), score_policy.base)
    text = score_policy.tokenizer.decode(gen.encode(obs(3), history, 6))
    assert "put a hot apple in fridge." in text and "already taken 6 step(s)" in text
    assert "observation number 5" in text and "observation number 4" in text and "observation number 3" not in text
    assert "<think> </think>" in text and "<action> </action>" in text and "go to fridge 1, go to fridge 10" in text
    tok = score_policy.tokenizer
    full = encode_prompt(tok, "score", obs(3).task, obs(3).text, ADMISSIBLE, history, 6, 2, None)
    limit = len(full) - 5  # dropping the oldest history pair is enough
    cut = encode_prompt(tok, "score", obs(3).task, obs(3).text, ADMISSIBLE, history, 6, 2, limit)
    assert len(cut) <= limit and "observation number 4" not in tok.decode(cut) and "Task:" in tok.decode(cut)
    long_obs = "You arrive at the kitchen. " + " ".join(f"On the shelf {i} you see a mug {i}." for i in range(60))
    no_history = encode_prompt(tok, "score", obs(3).task, long_obs, ADMISSIBLE, [], 6, 2, None)
    limit = len(no_history) // 2  # history gone, then the observation's head
    head = encode_prompt(tok, "score", obs(3).task, long_obs, ADMISSIBLE, history, 6, 2, limit)
    text = tok.decode(head)
    assert limit - 8 <= len(head) <= limit and text.endswith("Action:") and "observation number" not in text
    assert "put a hot apple in fridge." in text and "go to fridge 1, go to fridge 10" in text  # task, actions whole
    assert "You arrive at the kitchen." in text and " ..." in text and "mug 59" not in text
    tiny = encode_prompt(tok, "score", obs(3).task, obs(3).text, ADMISSIBLE, history, 6, 2, 20)
    no_history = encode_prompt(tok, "score", obs(3).task, obs(3).text, ADMISSIBLE, [], 6, 2, None)
    assert tiny == no_history[-20:] and tok.decode(tiny).endswith("Action:")  # not even the task fits: cut left


def test_parse_and_project():
    adm = ("go to fridge 1", "open fridge 1")
    assert parse_action("<think>hmm</think><action>open fridge 1</action>") == "open fridge 1"
    assert parse_action("<action>look</action> then <action> go to fridge 1 </action>") == "go to fridge 1"
    assert parse_action("<think>go somewhere</think>\nI will\nGo To  Fridge 1.") == "Go To  Fridge 1."
    assert parse_action("<action>open fridge 1") == "open fridge 1"
    assert parse_action("") is None and parse_action("<think>only thinking") is None
    assert project_action("open fridge 1", adm) == "open fridge 1"
    assert project_action("Go To  Fridge 1.", adm) == "go to fridge 1"
    assert project_action("go to fridge 2", adm) is None and project_action(None, adm) is None


def test_generate_mode_invalid_replies_flagged_not_crashes(cache):
    policy = Policy.from_config(make_cfg(action_mode="generate", max_new_tokens=12), CORPUS, cache, "cpu")
    out = policy.act([obs(3), obs(5)], [[], []], [0, 0])
    for a in out:
        assert a.action is None and a.invalid  # a random-init model writes no admissible command
        s = a.sample
        assert 0 < len(s.response_ids) <= 12 and len(s.old_logps) == len(s.response_ids)
        assert a.logp == pytest.approx(sum(s.old_logps), rel=1e-6)
        with torch.no_grad():  # the recorded log-probs are those the update recomputes
            logp, _, _ = token_logprobs(policy.model, [s.prompt_ids], [s.response_ids], s.temperature, policy.pad_id)
        assert torch.allclose(logp, torch.tensor(s.old_logps), atol=1e-4)
    greedy = policy.act([obs(3)], [[]], [0], greedy=True)[0]
    assert greedy.sample.response_ids == policy.act([obs(3)], [[]], [0], greedy=True)[0].sample.response_ids


def test_tiny_model_cached_and_roundtrip_exact(cache, score_policy, tmp_path):
    again = Policy.from_config(make_cfg(), CORPUS, cache, "cpu")
    assert again.base == score_policy.base  # same config + corpus -> same cached folder
    assert json.loads((again.base and open(f"{again.base}/milegpo_tiny.json").read()))["tiny"]["hidden_size"] == 32
    score_policy.save(tmp_path / "ckpt")
    loaded = Policy.load(tmp_path / "ckpt", make_cfg(), "cpu")
    for (k, v), (k2, v2) in zip(score_policy.model.state_dict().items(), loaded.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    texts = ["You arrive at countertop 1.", "take apple 1 from countertop 1", "go to fridge 10 <|endoftext|>"]
    for t in texts:  # ids unchanged by the reload (Qwen2Tokenizer would split digits differently)
        assert loaded.tokenizer(t).input_ids == score_policy.tokenizer(t).input_ids
    o = [obs(10)]
    assert loaded.act(o, [[]], [0], greedy=True)[0].sample == score_policy.act(o, [[]], [0], greedy=True)[0].sample


def test_lora_save_load_roundtrip(cache, tmp_path):
    cfg = make_cfg(lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_targets=["q_proj", "v_proj"])
    policy = Policy.from_config(cfg, CORPUS, cache, "cpu")
    assert 0 < policy.num_parameters(trainable_only=True) < policy.num_parameters()
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    policy.save(tmp_path / "lora")
    assert (tmp_path / "lora" / "base").exists() and (tmp_path / "lora" / "adapter").exists()
    loaded = Policy.load(tmp_path / "lora", cfg, "cpu")
    a, b = policy.act([obs(10)], [[]], [0], greedy=True)[0], loaded.act([obs(10)], [[]], [0], greedy=True)[0]
    assert a.sample == b.sample and a.logp == b.logp


def test_bad_inputs_raise_clear_errors(cache, score_policy):
    with pytest.raises(PolicyError, match="action_mode"):
        Policy.from_config(make_cfg(action_mode="beam"), CORPUS, cache, "cpu")
    with pytest.raises(PolicyError, match="corpus"):
        Policy.from_config(make_cfg(), None, cache, "cpu")
    with pytest.raises(TinyModelError, match="num_heads"):
        Policy.from_config(make_cfg(tiny=dict(TINY, hidden_size=33)), CORPUS, cache, "cpu")
    with pytest.raises(PolicyError, match="admissible"):
        score_policy.act([obs(0)], [[]], [0])
    with pytest.raises(PolicyError, match="histories"):
        score_policy.act([obs(2)], [], [0])


def _expanded_kv_logprobs(model, prompts, candidates, pad_id):
    """The scoring before packing (reference): prompts once, left-padded; their KV cache expanded to
    the candidates, which run as one right-padded batch."""
    import torch.nn.functional as F
    from milegpo_cli.policy.actions import pad

    p_ids, p_mask = pad(prompts, pad_id, left=True, device="cpu")
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True)
    first = F.log_softmax(out.logits[:, -1].float(), dim=-1)
    owner = torch.tensor([b for b, cs in enumerate(candidates) for _ in cs])
    c_ids, c_mask = pad([c for cs in candidates for c in cs], pad_id, left=False, device="cpu")
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    cache.batch_select_indices(owner)
    c_out = model(input_ids=c_ids, attention_mask=torch.cat([p_mask[owner], c_mask], dim=1),
                  position_ids=p_mask.sum(-1)[owner, None] + torch.arange(c_ids.shape[1]), use_cache=True,
                  **{"cache" if hasattr(out, "cache") else "past_key_values": cache})
    tok = torch.cat([first[owner].gather(-1, c_ids[:, :1]),
                     F.log_softmax(c_out.logits[:, :-1].float(), dim=-1).gather(-1, c_ids[:, 1:, None]).squeeze(-1)], 1)
    return list((tok * c_mask).sum(-1).split([len(cs) for cs in candidates]))


def test_packed_scoring_equals_expanded_kv_scoring_and_gradients_flow(cache):
    from milegpo_cli.policy.actions import ScoreSample, score_sample_logprobs

    policy = Policy.from_config(make_cfg(), CORPUS, cache, "cpu")
    with torch.no_grad():  # sharpen attention so that a wrong mask or position would show
        for name, p in policy.model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(30.0)
    observations = [obs(10), obs(4, "You are in the middle of a room."), obs(1), obs(7)]
    histories = [[], [("You see a fridge 1.", "look"), ("Nothing happens.", "inventory")], [], [("a", "look")]]
    prompts = [policy.encode(o, h, len(h)) for o, h in zip(observations, histories)]
    cands = [[policy.candidate_ids(a) for a in o.admissible] for o in observations]
    with torch.no_grad():
        packed = candidate_logprobs(policy.model, prompts, cands, policy.pad_id)
        ref = _expanded_kv_logprobs(policy.model, prompts, cands, policy.pad_id)
    for got, want in zip(packed, ref):
        assert torch.allclose(got, want, rtol=0.0, atol=1e-5), (got - want).abs().max()
    samples = [ScoreSample(p, c, len(c) - 1, 1.0, 0.0) for p, c in zip(prompts, cands)]
    logp, ent = score_sample_logprobs(policy.model, samples, policy.pad_id)
    logp.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.model.parameters() if p.requires_grad)
    assert logp.shape == ent.shape == (4,) and float(logp[2].detach()) == 0.0  # one candidate: probability 1


def test_identical_prompts_are_scored_once_and_draw_their_own_actions(cache, monkeypatch):
    import milegpo_cli.policy.core as core

    policy = Policy.from_config(make_cfg(), CORPUS, cache, "cpu")
    rows = []

    def counting(model, prompts, candidates, pad_id=0):  # the real scorer, counting the rows it gets
        rows.append(len(prompts))
        return candidate_logprobs(model, prompts, candidates, pad_id)

    monkeypatch.setattr(core, "candidate_logprobs", counting)
    torch.manual_seed(0)
    group = policy.act([obs(10)] * 6 + [obs(4)], [[]] * 7, [0] * 7, temperature=100.0)  # near uniform
    assert rows == [2]  # two distinct prompts scored for seven rollouts
    prompt = policy.encode(obs(10), [], 0)
    with torch.no_grad():
        seq = candidate_logprobs(policy.model, [prompt], [[policy.candidate_ids(a) for a in ADMISSIBLE]], policy.pad_id)[0]
    dist = candidate_distribution(seq, 100.0)
    for s in group[:6]:  # each rollout's log-prob is that of its own draw under the shared distribution
        assert s.action == ADMISSIBLE[s.sample.chosen] and abs(s.logp - float(dist[s.sample.chosen])) < 1e-5
    assert len({s.action for s in group[:6]}) > 1  # independent draws, not one action copied six times
    assert group[6].action in ADMISSIBLE[:4]


@pytest.mark.parametrize("lora", [False, True])
def test_split_forward_equals_the_block_masked_full_forward(cache, monkeypatch, lora):
    """split_forward.split_forward (the prompt region causal without a mask, the candidate region under its
    own mask, the last layer only at the positions the candidates' log-probs read) gives the full
    block-masked forward's log-probs and gradients (two layers, grouped-query attention, LoRA,
    prompts and candidate regions of different widths)."""
    from milegpo_cli.policy import actions, split_forward

    policy = Policy.from_config(make_cfg(tiny=dict(TINY, num_layers=2, num_heads=4, num_kv_heads=2), lora=lora),
                                CORPUS, cache, "cpu")
    assert split_forward.split_forward_supported(policy.model.get_decoder())
    with torch.no_grad():  # sharpen attention so that a wrong mask or position would show
        for name, p in policy.model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")) or "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.3).mul_(3.0)
    observations = [obs(10), obs(4, "You are in the middle of a room."), obs(1)]
    histories = [[], [("You see a fridge 1.", "look"), ("Nothing happens.", "inventory")], [("a", "look")]]
    prompts = [policy.encode(o, h, len(h)) for o, h in zip(observations, histories)]
    cands = [[policy.candidate_ids(a) for a in o.admissible[:k]] for o, k in zip(observations, (6, 2, 4))]
    out = {}
    for split in (False, True):
        monkeypatch.setattr(actions, "SPLIT_FORWARD", split)
        policy.model.zero_grad()
        seq = candidate_logprobs(policy.model.train(), prompts, cands, policy.pad_id)
        flat = torch.cat(seq)
        (flat * torch.linspace(-1.0, 1.0, len(flat))).sum().backward()
        out[split] = (torch.cat(seq).detach(), [p.grad.clone() for p in policy.model.parameters() if p.requires_grad])
    assert torch.allclose(out[True][0], out[False][0], rtol=0.0, atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())) for a, b in zip(out[True][1], out[False][1]))  # float32 order
    assert out[True][0].std() > 0.1  # the scores are not trivially equal
