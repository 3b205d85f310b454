"""The character vocabulary of the locally built tokenizer (no hub). Pure Python, so the plan can size it."""

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS)
CHARS: str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ +-*/=?:;,.!()[]<>'\"_#"
CHAR_VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(CHARS)
CHAR_VOCAB_SIZE: int = len(CHAR_VOCAB)
