"""The default regular expressions of the meta-text and refusal rules
(``pairs.meta_patterns``, ``pairs.refusal_patterns``): data, documented in docs/audit.md."""

from __future__ import annotations

# Meta-text: an answer that talks about its brief. Each pattern was checked against
# realistic phrasings (tests/test_checks.py: 130 that must match, including two rounds
# written after the patterns were frozen, and 171 ordinary advice sentences full of
# "expectations", "aspects", "instructions", "your profile" that must not). Ordinary uses
# of the same words are kept out by requiring a second cue: a determiner plus a stating
# verb ("the points you listed"), a self-reference ("this answer avoids"), or a word limit.
DEFAULT_META_PATTERNS: tuple[str, ...] = (
    # the brief's own vocabulary
    r"\brubric",
    r"\b(?:the|these|those|your|all) (?:listed|given|expected|specified|stated|provided|"
    r"targeted) (?:aspects?|points|criteria|requirements|expectations)\b",
    r"\b(?:aspects?|points|criteria|rubric items|guidelines|instructions|constraints|"
    r"preferences) (?:that )?(?:you|the user)(?: have)? (?:listed|gave|provided|specified|"
    r"outlined|highlighted|set out|shared|wanted(?: covered)?|expect(?:ed)?|asked for)\b",
    r"\b(?:aspects?|criteria|points|preferences) (?:that )?(?:you|the user)(?: have)? "
    r"(?:mentioned|described|noted|raised|identified|care about)\b",
    r"\b(?:your|the user's) stated (?:preferences|expectations|aspects|criteria|"
    r"requirements|needs)\b",
    r"\b(?:you|the user) (?:asked|told|instructed|wanted) me to\b",
    r"\b(?:in keeping with|in line with|in accordance with|respecting|honou?ring|"
    r"responding to) (?:your|the) (?:request|instructions?|brief|constraints|criteria|"
    r"requirements|expectations)\b",
    r"\b(?:constraints|instructions|requirements|rules) of (?:this|the) (?:task|prompt)\b",
    r"\b(?:based on|given|from|according to) your (?:profile|post history|past posts|"
    r"previous posts)\b(?!\s+(?:picture|photo|page|views|settings)\b)",
    r"\bthe user(?:'s)? (?:stated |listed |specific )?(?:expect(?:s|ed|ations?)?|"
    r"prefer(?:s|red|ences?)?|wants|requested|request|asked|criteria|rubric)\b",
    r"\bwhat you expect (?:in|from) (?:an?|this|the|my) (?:answer|response|reply)\b",
    # instructions and requests
    r"\bas (?:you )?(?:requested|instructed|specified|wanted|asked)\b"
    r"(?!\s+(?:by|on|in|at|for|about|me|him|her|them)\b)",
    r"\b(?:as )?per (?:your|the|these) (?:given |stated |provided )?(?:instructions?|brief|"
    r"request|requirements|criteria|guidelines|specifications?)\b"
    r"(?!\s+(?:on|in|of|from|for|at)\b)",
    r"\b(?:following|according to|in line with|to follow) (?:your|the given|the provided|"
    r"the stated) "
    r"(?:instructions?|brief|request|requirements|criteria|guidelines)\b",
    r"\b(?:the|your|these) instructions (?:say|said|ask|asked|require|required|requested)\b",
    # an answer that describes itself
    r"\b(?:this|my|the above|the following) (?:answer|response|reply),? (?:\w+ ){0,2}"
    r"(?:covers?|avoids?|address(?:es)?|focus(?:es)?|omits?|ignores?|leaves out|steers clear|"
    r"meets?|satisfies|follows?|stays|keeps|sticks|is tailored|was written|is written|"
    r"deliberately|intentionally|purposely|does not|doesn't|won't|will not)\b",
    r"\b(?:answer|response|reply) below (?:is|was|has been) (?:written|tailored|kept|designed)",
    r"\b(?:here(?:'s| is)|below is|the following is|below you(?:'ll| will) find) "
    r"(?:a|an|my|the) (?:[\w,-]+ ){0,3}(?:answer|response|reply)\b",
    r"\bthe following (?:answer|response|reply)\b",
    r"\b(?:answer|response|reply) below\b",
    r"^\W*(?:answer|response|reply)\s*(?:\([^)\n]*\))?\s*:",
    r"\b(?:deliberately|intentionally|purposely) (?:generic|general|neutral|impersonal|"
    r"non-personali[sz]ed|unpersonali[sz]ed)\b",
    r"\bgeneric (?:answer|response|reply)\b",
    r"\b(?:ignoring|disregarding|setting aside|sidestepping|steering clear of) (?:all |any |"
    r"every )?(?:of )?(?:(?:the|these|those) (?:\w+ )?(?:aspects|criteria|rubric|"
    r"expectations)|your (?:stated |listed )?(?:criteria|aspects|rubric))\b",
    r"\b(?:within|per|outside|following|stick(?:ing)? to|stay(?:ing)? on) (?:the|your|my) "
    r"brief\b",
    r"\b(?:every|each|any|all) (?:aspects?|points?|items?|criteria) (?:in|on|from) the list\b",
    r"\bi(?:'ve| have)? (?:written|kept|designed|tailored|structured) this (?:answer |"
    r"response |reply )?(?:to|so|around|for|under|short|brief|general)\b",
    r"\bi (?:(?:deliberately|intentionally|purposely) )?(?:did not|didn't|won't|will not|"
    r"have not|haven't) (?:mention(?:ed)?|address(?:ed)?|cover(?:ed)?|touch(?:ed)? on|"
    r"go(?:ne)? into|bring up|brought up|include[d]?|discuss(?:ed)?) (?:your|the user's|"
    r"any of your|the specific|the specifics|specifics)\b",
    r"\bi (?:deliberately|intentionally|purposely) (?:did not|didn't|avoided|omitted|"
    r"left out|ignored|excluded)\b",
    r"\b(?:left out|omitted|excluded|avoided|ignored|skipped) (?:on purpose|deliberately|"
    r"intentionally)\b",
    r"\bpersonali[sz]ed (?:aspects|details|points|elements)\b",
    r"\b(?:the )?(?:required|requested|allowed|given) (?:length|word count)\b(?!\s+of\b)",
    r"\b(?:aspects?|points|criteria) (?:from|in|on) the list\b",
    r"\b(?:the|this) task(?:'s)? (?:requirements|instructions|constraints|rules)\b",
    r"\b(?:in|from|by|with) this (?:answer|reply)\b",
    r"\bpreferences (?:in|from|on) your profile\b",
    r"\b(?:relying on|drawing on|draw on|rely on) (?:anything in )?your profile\b",
    r"\b(?:things|points|aspects) you said you (?:care about|want|expect|prefer)\b",
    r"\bhere(?:'s| is) what you asked for\b",
    r"\bkept (?:it |this )?(?:under|within|below) \d+ words\b",
    r"\b(?:the )?aspects? (?:provided|given|listed|specified|above)\b",
    r"\b(?:the )?criteria (?:provided|listed|specified)\b",
    r"\b(?:without|no) personali[sz]ation\b",
    r"\b(?:without|not|avoid(?:s|ed|ing)?|never) (?:explicitly )?(?:mentioning|mention of|"
    r"addressing|covering|touching on|referring to|reference to|discussing|going into) "
    r"(?:any of )?"
    r"(?:the|your|these|those) (?:specific |stated |listed |given )?(?:criteria|aspects|"
    r"points|requirements|rubric|expectations|preferences)\b",
    r"\b(?:addresses|covers|satisfies|honou?rs|avoids|ignores|omits) (?:all |each |every |"
    r"none )?(?:of )?(?:the|your|these|those) (?:stated |listed |given )?(?:expectations|"
    r"criteria|aspects)\b",
    r"\bi(?:'ve| have)? (?:deliberately |intentionally |purposely |carefully )?(?:avoided|"
    r"omitted|left out|steered clear of|excluded|ignored|not (?:mentioned|included|addressed|"
    r"covered)) (?:any |all )?(?:(?:explicit )?mention(?:ing)?|references?|"
    r"(?:the|your|these|those) (?:\w+ )?(?:aspects|points|criteria|requirements|preferences|"
    r"expectations|topics))\b",
    r"\bi(?:'ve| have) (?:included|covered|addressed|incorporated|made sure to (?:include|"
    r"cover|address)) (?:all |each |every )?(?:of )?(?:the|your) (?:points|aspects|criteria|"
    r"requirements|preferences|expectations)\b",
    r"\b(?:tailored|customi[sz]ed|personali[sz]ed) (?:to|for) (?:your|the user's) "
    r"(?:profile|criteria|rubric|expectations|stated preferences)\b",
    r"\bas an ai\b(?: language model| assistant)?",
    # word limits
    r"\b(?:keeping this|(?:i(?:'ve| have) )?kept (?:it|this|the answer|the response|my answer)) "
    r"(?:brief |short |concise )?(?:under|within|below|to) \d+ words\b",
    r"\b(?:under|within|below|in) (?:the |my )?(?:requested |allowed |given )?"
    r"(?:[5-9]\d|1[0-4]\d|150)[- ]word (?:limit|cap)\b",
    r"\bword count\s*[:=]?\s*\d+\s*\)?\s*$",
    r"\(\s*(?:approx(?:imately|\.)?|about|around|~)?\s*\d+\s+words?\s*\)\s*$",
)
# Refusals: an apology or inability at the start, or "I cannot help/provide..." anywhere;
# "I'm sorry to hear..." and "I can't help but notice" are ordinary openings, not refusals.
DEFAULT_REFUSAL_PATTERNS: tuple[str, ...] = (
    r"^\W*(?:i'?m sorry|sorry|i apologi[sz]e),? (?:but )?(?:i|as an ai|that|this)\b",
    r"^\W*as an ai\b",
    r"\bi (?:cannot|can't|can not|won't|am unable to|am not able to) "
    r"(?:help(?!\s+but\b)|assist|provide|answer|comply)\b",
    r"\bi(?:'m| am) (?:not able|unable) to (?:help(?!\s+but\b)|assist|provide|answer|comply)\b",
)
