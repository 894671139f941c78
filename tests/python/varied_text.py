"""Real, varied text for tokenizer parity, gathered from what the machine already has:
prose and markup (the Python documentation sources of the python3.11-doc package), code (this repo and
LibTorch's headers), translations in many scripts (gettext catalogues under /usr/share/locale), plus
constructed stress lines for numbers, emoji, whitespace runs and special-token strings inside text."""
import gettext
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
PY_DOCS = pathlib.Path("/usr/share/doc/python3.11/html/_sources")
LOCALES = ["zh_CN", "zh_TW", "ja", "ko", "ru", "uk", "ar", "he", "fa", "hi", "bn", "ta", "th", "el", "ka", "hy",
           "vi", "tr", "pl", "de", "fr", "es", "pt_BR", "am", "km", "my", "si", "ml"]

STRESS = [
    "Numbers: 0 7 42 123 1234 12345 123456789 3.14159 -2.5e-10 1,234,567.89 0x1F 0b1010 2026-11-29 12:34:56 +44 20 7946 0958",
    "Emoji: 🤗 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇬🇧🇯🇵 ❤️ ✨🚀 🧑🏿‍💻 ☕️ 🏳️‍🌈 1️⃣ #️⃣",
    "Whitespace:  two  spaces,\tone tab,\t\ttwo tabs,     five spaces,\n\n\nthree newlines,\r\nCRLF, trailing   \n"
    "\u00a0nbsp\u00a0\u3000ideographic space\u2003em space \u2028line sep\u2029para sep \u0085 nel \u200b zwsp",
    "Special tokens inside text: <|endoftext|> then <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|endoftext|>"
    " and <|pad|><|pad|> and |||EMAIL_ADDRESS||| and |||PHONE_NUMBER|||, partial <|endoftext| and <|im_start and "
    "<||endoftext|>, <|fim_prefix|>x<|fim_middle|>y<|fim_suffix|>, <|extra_id_10|> <|extra_id_1|>0",
    "Contractions: I'm you're he's we've they'll I'd DON'T It'S we'VE 'S 's's ſ 'ſ Ǆ ǅ ǆ",
    "Mixed: naïve café coöperate façade résumé Straße İstanbul ǅemal ΣΊΣΥΦΟΣ ﬁ ﬂ ㎏ ½ ² ⁵ Ⅻ ℌ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚",
    "Combining: e\u0301 a\u0308 n\u0303 \u0915\u093f \u0e01\u0e34 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319",
    "Code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }  // comment\n    def f(a, b=None):\n        return {**a, 'b': b}\n",
    "Long runs: " + "=" * 300 + " " + "-" * 77 + " " + "a" * 500 + " " + "9" * 40 + " " + "!?" * 60,
]


def documents(min_bytes=1_100_000):
    """Returns a list of documents totalling at least min_bytes of UTF-8."""
    docs = []
    size = lambda: sum(len(d.encode("utf-8")) for d in docs)
    docs.extend(STRESS * 3)
    # Translations in many scripts: every msgstr of the catalogues of each locale.
    for locale in LOCALES:
        chunk = []
        for mo in sorted(pathlib.Path("/usr/share/locale", locale, "LC_MESSAGES").glob("*.mo")):
            try:
                with open(mo, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except Exception:
                continue
            chunk.extend(v for v in catalog.values() if isinstance(v, str) and v.strip())
            if sum(len(c) for c in chunk) > 12_000:
                break
        if chunk:
            docs.append("\n".join(chunk))
    # Code.
    for pattern in ("src/**/*.cpp", "include/**/*.h", "tests/**/*.py", "archs/**/*.py"):
        for path in sorted(REPO.glob(pattern)):
            docs.append(path.read_text(encoding="utf-8"))
    # Prose and markup fill the rest.
    for path in sorted(PY_DOCS.rglob("*.txt")):
        if size() >= min_bytes:
            break
        docs.append(path.read_text(encoding="utf-8"))
    return docs
