"""Finding the subject and the target of a fact in a tokenised prompt (paper §6; ROME's ``find_token_range``).

A fact is a prompt, a subject inside it and a target continuation ("The Space Needle is in downtown",
"Space Needle", " Seattle"). The subject's tokens are found by *character* offsets, so any fast tokenizer works
(leading-space tokens, SentencePiece pieces, a BOS with an empty span); the token roles of ROME's
average-effect figure (:data:`ROLES`) follow from the subject's token range.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from depthlib.errors import InputError

#: Token roles of ROME's average-effect figure, in prompt order.
ROLES = ("before subject", "first subject", "middle subject", "last subject", "first subsequent",
         "further tokens", "last token")


@dataclass
class Located:
    """A prompt tokenised, with its subject tokens and target token found by character offsets."""

    text: str                      # what the model reads (the prompt without the target)
    subject: str
    target: str | None             # the target continuation text (None: the model's top-1, set later)
    input_ids: torch.Tensor        # (1, T)
    tokens: list[str]              # T decoded tokens
    subject_range: tuple[int, int]  # token indices [start, stop) overlapping the subject characters
    target_id: int | None

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def roles(self) -> list[str]:
        """ROME's token categories (``ROLES``) for every position; the last token wins ties."""
        a, b = self.subject_range
        out = []
        for t in range(self.n_tokens):
            if t == self.n_tokens - 1:
                out.append("last token")
            elif t < a:
                out.append("before subject")
            elif t == b - 1:
                out.append("last subject")
            elif t == a:
                out.append("first subject")
            elif t < b:
                out.append("middle subject")
            elif t == b:
                out.append("first subsequent")
            else:
                out.append("further tokens")
        return out


def _encode(tokenizer, text: str):
    try:
        enc = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    except NotImplementedError:
        raise InputError(f"{type(tokenizer).__name__} cannot return character offsets; use a fast tokenizer") from None
    return enc["input_ids"], enc["offset_mapping"][0].tolist()


def locate(tokenizer, prompt: str, subject: str, target: str | None = None) -> Located:
    """Tokenise ``prompt`` and find the subject tokens and the target token by characters.

    - The subject must occur in the prompt (first occurrence; case-sensitive, else case-insensitive).
      Its tokens are those whose character span overlaps the subject's, so any tokenizer works
      (leading-space tokens, SentencePiece pieces, BOS with an empty span).
    - The target is either the continuation of the prompt (" Seattle" after "... downtown"), or the end
      of the prompt itself (the paper's form: "... downtown Seattle" with target "Seattle"); in both cases
      the model reads the text before the target and the target token is the first token of the target in
      the joint tokenisation. ``target=None`` leaves it to the clean run (the model's top-1).

    Raises :class:`InputError` if the subject is not found, the target is empty, or the target does not
    start at a token boundary of the joint text.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError("prompt is empty")
    if not isinstance(subject, str) or not subject.strip():
        raise InputError("subject is empty")
    text = prompt
    if target is not None:
        if not isinstance(target, str) or not target.strip():
            raise InputError("target is empty")
        stripped = prompt.rstrip()
        if stripped.endswith(target.strip()) and len(stripped) > len(target.strip()):
            cut = len(stripped) - len(target.strip())
            # keep the target's leading space with the target (" Seattle"), as tokenizers do
            while cut > 0 and stripped[cut - 1].isspace():
                cut -= 1
            text, target = stripped[:cut], stripped[cut:]
    start = text.find(subject)
    if start < 0:
        start = text.lower().find(subject.lower())
    if start < 0:
        where = "the prompt without its target" if text != prompt else "the prompt"
        raise InputError(f"subject {subject!r} not found in {where} {text!r}")
    stop = start + len(subject)
    ids, offsets = _encode(tokenizer, text)
    subj = [i for i, (s, e) in enumerate(offsets) if e > s and s < stop and e > start]
    if not subj:
        raise InputError(f"no token covers subject {subject!r} in {text!r}")
    target_id = None
    if target is not None:
        full_ids, _ = _encode(tokenizer, text + target)
        n = ids.shape[1]
        if full_ids.shape[1] <= n or not torch.equal(full_ids[0, :n], ids[0]):
            raise InputError(f"target {target!r} does not start at a token boundary after {text!r}; "
                             "put the separating space in the target (' Seattle')")
        target_id = int(full_ids[0, n])
        if not target[:1].isspace() and text[-1:].isalnum() and target[:1].isalnum():
            warnings.warn(f"target {target!r} is glued to the prompt's last word ({text[-12:] + target!r}); the "
                          f"scored token is {tokenizer.decode([target_id])!r}. Did you mean {' ' + target!r}?",
                          stacklevel=2)
    tokens = [tokenizer.decode([int(i)]) for i in ids[0]]
    return Located(text=text, subject=text[start:stop], target=target, input_ids=ids, tokens=tokens,
                   subject_range=(subj[0], subj[-1] + 1), target_id=target_id)
