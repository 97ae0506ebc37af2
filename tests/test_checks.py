"""The per-pair rules (pipeline/rules/) on realistic text: meta-text phrasings,
refusals, truncation, rubric echo, and the pattern gate that keeps them fast.

Every sentence below was written by hand for these tests (they are not model output).
The meta-text phrasings came in rounds: META_DEV and two widening rounds were written
while the patterns were built; META_HELD_OUT_1 and _2 were each written before running
them, against frozen patterns, and caught 12 of 20 each time (60%); the misses were then
added to the patterns, so all of them match now. ORDINARY holds advice sentences heavy
with the same words ("expectations", "aspects", "instructions", "your profile", "as
instructed by your doctor", "I'm sorry to hear"), the last 40 written after the patterns
were frozen; none may match (0 of 171).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import pairs_section
from pipeline.core.fields import words
from pipeline.rules import Answer, Hit, RowView, RuleSet, ends_mid_sentence
from pipeline.rules.patterns import DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS
from pipeline.rules.regexgate import PatternSet

META_DEV = [
    "As you requested, here are three ways to practise on the train.",
    "Based on the points you listed, I'd start with short gesture sessions.",
    "This answer avoids the aspects you care about and stays general.",
    "Here is a response that addresses your expectations about budget and space.",
    "Try a structured course, without mentioning the criteria you gave.",
    "Per your instructions, I focused on general fundamentals.",
    "I've kept it under 100 words, so here are the essentials.",
    "This response covers all the key aspects of your situation.",
    "Following your instructions, the advice below stays generic.",
    "Certainly! Here's a tailored answer for you: start with walk-run intervals.",
    "I have deliberately avoided mentioning the commute.",
    "I've included all the points you wanted: cost, space and noise.",
    "The rubric asks for budget-friendly options, so consider a used turntable.",
    "In line with the provided criteria, this plan keeps sessions short.",
    "Start small and build up. (Word count: 87)",
    "Start small and build up. Word count: 92",
    "Start small and build up, and review monthly. (95 words)",
    "Staying within the 100-word limit, here is my advice.",
    "Note: this reply does not address the user's preferences.",
    "Sure, here is a general answer that ignores the specific expectations.",
    "As instructed, I have not mentioned the budget.",
    "Rather than the listed aspects, focus on theory first.",
    "Without touching on any of the preferences you described, the usual route is a course.",
    "To meet the expected criteria, keep each session under twenty minutes.",
    "Addressing the user's expectations, I suggest a soft surface.",
    "I've made sure to cover all of your points in this plan.",
    "Here's my response, focused on what matters most.",
    "This reply intentionally omits the details you might expect.",
    "The aspects you expected are not covered here; instead, study anatomy.",
    "Per the brief, the advice is kept general.",
    "The instructions asked me to avoid specifics, so here is a general plan.",
    "According to your requirements, a small speaker works best.",
    "I have not included the requirements you specified.",
    "Tailored to your profile, here is my advice: keep sessions short.",
    "As specified, the answer stays general and avoids personal details.",
    "Here is an answer that leaves out the listed points.",
    "I avoided the aspects you mentioned and kept to the basics.",
    "The response below is written to avoid the user's stated preferences.",
    "Answering generally, without reference to your specific criteria, I would take a course.",
    "This is a general answer that does not follow the rubric.",
    "As per the given guidelines, here is a neutral plan.",
    "Meeting all the listed requirements, the plan uses podcasts and short walks.",
    "Note that this answer intentionally ignores your budget.",
    "Here's a concise, personalized response: build on the journaling habit.",
    "The criteria you provided suggest a slim neck guitar.",
    "As an AI language model, I suggest a gradual routine.",
    "Keeping this under 100 words: start with five-minute sessions.",
    "I kept the answer within 100 words as asked.",
    "This answer is tailored to your stated preferences and keeps things short.",
    "My reply stays away from the points you listed.",
]

META_ROUND_2 = [
    "Since you asked me to keep things general, here is a broad overview.",
    "In keeping with your request, I won't go into specifics about your budget.",
    "To respect the constraints of this task, I'll stay brief.",
    "This advice was written to satisfy the aspects you highlighted.",
    "Below is an answer that deliberately sidesteps your preferences.",
    "I have focused on the expected aspects: cost and space.",
    "Avoiding the rubric points, a classic approach would be an anatomy course.",
    "The guidance here does not reflect the preferences in your profile.",
    "Note: I have omitted any reference to your commute as instructed.",
    "My answer keeps to the word limit you set.",
    "As requested, this stays under 100 words.",
    "Here's a generic response without personalization.",
    "I tailored this response to the criteria you outlined.",
    "Responding to your expectations, here is a gentle plan.",
    "Per the requirements, the answer stays neutral.",
    "This response intentionally leaves out the user-specific details.",
    "I have addressed each aspect you listed above.",
    "Following the guidelines you provided, start with scales.",
    "Here is a personalized answer based on your profile.",
    "This answer does not consider the points from the rubric.",
]

META_ROUND_3 = [
    "Keeping your stated preferences out of it, the standard route is a night class.",
    "I won't touch on the specific points you raised.",
    "Great question! Below you'll find a response that sticks to the essentials you expect.",
    "To stay within the brief, I'll keep this general.",
    "I've written this to avoid every aspect in the list.",
    "As per your request, the advice below is short.",
    "Without going into the criteria you care about, a general tip is to rest.",
    "Note: the following answer was kept under the word limit.",
    "This response is intentionally generic and does not use your profile.",
    "Your listed expectations are covered below.",
    "Word count: 78",
    "(Approximately 90 words)",
    "Here are some suggestions that align with the preferences you shared.",
    "I deliberately did not mention your knee.",
    "The personalized aspects have been left out on purpose.",
    "Per your guidelines, I kept it short.",
    "In accordance with your instructions, here is my advice.",
    "I followed the rubric closely: budget first, then placement.",
    "This reply focuses on the aspects the user cares about.",
    "Sticking to the points you wanted covered: budget and noise.",
]

META_HELD_OUT_1 = [
    "Here's a general answer that doesn't lean on any of the user's interests.",
    "Note: This answer purposely avoids the listed preferences.",
    "I focused only on the points you asked me to include.",
    "Here's an answer that meets all of the criteria.",
    "Since the rubric emphasizes budget, I kept the options cheap.",
    "As you wanted, the advice here leaves out commute-friendly tips.",
    "Intentionally ignoring the aspects above, the answer is to take a course.",
    "This is a deliberately generic response.",
    "The answer below steers clear of your expectations.",
    "(This response avoids the aspects you listed.)",
    "Answer (under 100 words): start with five minutes a day.",
    "I've avoided any reference to digital tools, as requested.",
    "The key aspects you expect are covered: short sessions and free resources.",
    "Here's my attempt at an answer that ignores your preferences.",
    "Below, I cover each of the expected points.",
    "To follow your instructions, I'll skip the personal angle.",
    "Okay, here is an answer written without regard to the rubric.",
    "Per the task, this answer stays neutral.",
    "I kept my reply short, as you asked.",
]

META_HELD_OUT_2 = [
    "This advice purposely does not draw on anything in your profile.",
    "Here's a straightforward response, leaving aside the criteria.",
    "I have tried to address all the aspects you care about.",
    "Keeping to the required length, here are my tips.",
    "Absolutely! Here's an answer tailored to the rubric.",
    "I'll avoid mentioning the expected aspects and give general advice.",
    "This version leaves out the points from the list above.",
    "Following the task's requirements, I'll keep things general.",
    "The answer stays within 100 words, as instructed.",
    "As requested, I won't refer to your background.",
    "Note that I have not included the preferences you described.",
    "Here is a response that covers none of the listed aspects.",
    "Your specific preferences are not considered in this reply.",
    "This reply was written to avoid the user's expectations.",
    "Response (generic): start with a beginner course.",
    "Addressing each of the rubric items: budget, speakers, placement.",
    "Without relying on your profile, my advice is to practise daily.",
    "I've steered clear of the things you said you care about.",
    "Here is what you asked for, kept under 100 words.",
    "Based on the aspects provided, the best route is a short course.",
]

ORDINARY = [
    "Manage your expectations: progress with hands takes months, not days.",
    "Consider the following points before you buy a turntable.",
    "Several aspects of drawing improve together when you practise gesture.",
    "The user interface of Procreate makes layers easy to manage.",
    "This approach works for most beginners with limited time.",
    "I can't recommend this book enough if you like playful drills.",
    "Follow the instructions on the packet and rest the dough overnight.",
    "According to the guidelines from the NHS, adults should move every day.",
    "Keep your essay under 500 words if the competition has a word limit.",
    "Your response to stress matters more than the stressor itself.",
    "This response from your body is normal after a long run.",
    "Here is a quick recipe you can make in twenty minutes.",
    "Take the tablets as instructed by your doctor.",
    "Adjust the seat height as required so your knee stays slightly bent.",
    "Use the spare key as instructed on the landlord's note.",
    "Read the assembly steps per the instructions in the box.",
    "Write down what you expect to spend each month before you start saving.",
    "Think about what you expect from a partner before the conversation.",
    "Check the user manual for the speaker's input settings.",
    "Users want quick answers, so keep your shop's FAQ short.",
    "Check the visa requirements they set out on the embassy website.",
    "The expectations you mentioned from your in-laws are common in many families.",
    "Pack the required items the night before your trip.",
    "Given points of view differ, talk it through calmly.",
    "I have avoided sugar for a year and my energy is steadier.",
    "I've included a sample budget below so you can adapt it.",
    "I've covered the basics of walk-run intervals in my own training.",
    "A plan tailored to your needs beats a generic programme.",
    "If you keep it under 100 words, your bio will actually be read.",
    "Write a short story each week (500 words) to build the habit.",
    "Track your word count: 500 a day adds up to a novella in a few months.",
    "I'm sorry to hear about your knee; a gradual plan will help.",
    "I'm sorry you're going through this with your in-laws.",
    "I can't help but notice how much you enjoy the commute sketches.",
    "My answer would be to start with the smallest possible routine.",
    "Here's the thing: small habits stick better than big ones.",
    "Sure, it takes time, but you will get there.",
    "Of course, a used turntable is the cheapest route.",
    "Certainly the Loomis book is dry, but its early chapters are useful.",
    "Start with what you already enjoy and build from there.",
    "Your criteria for a good school are reasonable: distance and cost matter.",
    "Give the shop a call and describe what you need.",
    "Cover the basics first: budget, space and noise.",
    "Avoid the aspects of the job that drain you by batching email.",
    "Follow the plan for four weeks before you judge it.",
    "Aim for a budget of roughly 300 and look at second-hand decks.",
    "Set expectations with your advisor at the start of each term.",
    "Keep the routine very small so it survives busy mornings.",
    "Ask your husband to share the plan with his family first.",
    "Treat Sundays as something you plan together.",
    "Use folk songs you already know and practise twenty minutes a day.",
    "Photograph your own hand and trace it on a lower layer.",
    "Some answers are better found in a good library than online.",
    "The stress response is your body's way of preparing you.",
    "Walk-run intervals keep the load on your knee manageable.",
    "Find an accountability partner and meet weekly.",
    "Save a percentage of each payment into a buffer account.",
    "Pay down the 5.5% loans first if the deposit can wait a year.",
    "A cheaper area may cut your rent by a third.",
    "Respect the weight your in-laws place on family gatherings.",
    "Short scripts help: say thank you, give a reason, offer another time.",
    "Visit the city museum on a free evening and join a walking tour.",
    "Explore history on foot with a self-guided route from the library.",
    "Join a language exchange that meets in a café.",
    "Bring dessert to show you value the gathering.",
    "Practise listening to villains who believe they are right.",
    "Let the political world shape the villain's motives.",
    "Less monologue, more subtext in villain dialogue.",
    "Choose a short-scale guitar with a slim neck and light strings.",
    "Build on your piano knowledge: chord shapes transfer well.",
    "Anchor the routine to waking up rather than a clock time.",
    "Build around your existing journaling habit.",
    "Do brisk walks under cover when it rains.",
    "Save a podcast series you love for the sessions.",
    "Flexible time blocks and tiny next steps help with ADHD.",
    "Body doubling with a friend makes writing easier.",
    "Work in the environments that already work for you.",
    "An income buffer smooths irregular pay.",
    "Leave early some weeks rather than skipping entirely.",
    "Phono preamps are built into many powered speakers.",
    "Place the turntable on a solid shelf away from the speakers.",
    "If your landlord ignores your request, put it in writing and keep a copy.",
    "Update your profile picture before you start applying for jobs.",
    "A recruiter will look at your profile on LinkedIn, so keep it current.",
    "Read the assembly instructions twice before you start drilling.",
    "The first answer that comes to mind is often the honest one.",
    "Your body's response to cold water fades after a few swims.",
    "Set clear expectations with your flatmates about cleaning.",
    "Criteria for choosing a school should include the commute and the cost.",
    "Look at every aspect of the contract before you sign.",
    "The following is a simple weekly plan: Monday strength, Wednesday intervals, Sunday walk.",
    "Here are some options that fit a small flat.",
    "Below is a rough budget for the first month.",
    "Ask the teacher what they expect from the first assignment.",
    "Write a reply to the email within a day so it does not pile up.",
    "The best response to criticism is to ask for one concrete example.",
    "If the guidelines at work are unclear, ask your manager to write them down.",
    "Keep a journal of what you ate and how you felt.",
    "Many beginners ignore the aspects of form that prevent injury.",
    "Requests for time off are easier when you give plenty of notice.",
    "A good reply to a rude comment is a short, calm one.",
    "The rules of the game are simple once you play a round.",
    "Meet the requirements for the visa before you book flights.",
    "Honour your commitments, but say no to new ones this month.",
    "Respect the constraints of your budget and buy second-hand.",
    "In line with most running coaches, increase distance slowly.",
    "Following the recipe exactly the first time helps you learn it.",
    "Track your progress in a notebook and review it on Sundays.",
    "Choose a guitar whose neck feels comfortable in your hand.",
    "Speak to your husband first so you present a united front.",
    "A short walk after dinner helps digestion and sleep.",
    "Your past posts on forums can help you find people with the same hobby.",
    "Consider which aspects of city life you would miss in a smaller town.",
    "Your expectations of yourself may be higher than anyone else's.",
    "The instructions for the exam say you may bring a calculator.",
    "Ask your doctor how to respond if the pain returns.",
    "This answer to a common question may surprise you: rest more.",
    "Sticking to a schedule matters more than the exact time.",
    "If you are unsure, start with the cheapest option and upgrade later.",
    "Compare three turntables in the same price range before deciding.",
    "The point you make about cost is fair; second-hand gear is cheaper.",
    "Libraries often run free walking tours of old neighbourhoods.",
    "Plan your week on Sunday evening and keep Friday light.",
    "You can request a refund within thirty days in most shops.",
    "Keep your reply brief and thank them for the invitation.",
    "Your question touches on an important aspect of family life.",
    "Build the habit first and worry about the details later.",
    "Practise the hardest passage slowly, then at tempo.",
    "Many writers keep a word count log to stay motivated.",
    "Aim for essays of around 100 words when you start journaling.",
    "The museum's answer to crowds is timed entry, so book ahead.",
    "Write down the three things you expect from a new job before the interview.",
    "As you gain confidence, lengthen the runs by five minutes.",
    "The instructions on the tin say to stir every ten minutes.",
    "Here is how I would approach it: small steps, every day.",
    "Your preferences matter, so test two guitars in the shop.",
    "Personalized training plans are worth paying for if you can afford one.",
    'A good answer to "why do you want this job" is specific.',
    "Make a list of your priorities and rank them.",
    "Most people ignore the small print; read it.",
    "Avoid the temptation to buy every gadget at once.",
    "The brief for the mural asked for bright colours, so pick a bold palette.",
    "Leave out sugar from your morning coffee for a week and see how you feel.",
    "I kept a journal for years and it helped me notice patterns.",
    "Your in-laws' expectations will soften once they see you make an effort.",
    "Be clear about the points you want to make before the meeting.",
    "Stick to the plan for a month before changing anything.",
    "The key aspects of a good villain are motive, belief and cost.",
    "Deliberately practise the passages you find hardest.",
    "On purpose, schedule rest days so your knee recovers.",
    "The response time of your speakers matters less than placement.",
    "If you asked me what mattered most, I'd say consistency.",
    "Here's what worked for a friend in the same situation.",
    "Your background in piano will make chords easier.",
    "Keep the required length of the essay in mind when you outline it.",
    "Ignore the noise online and pick one programme.",
    "Look for courses that fit the criteria that matter to you: cost and schedule.",
    "Answer emails in one batch after lunch.",
    "Leave out anything that doesn't move the project forward.",
    "Set aside thirty minutes on Sunday to plan the week.",
    "A generic plan is a fine place to start if you adjust it later.",
    "Practise gestures on the train, as many illustrators do.",
    "The points system at the gym rewards regular visits.",
    "Don't let other people's expectations set your pace.",
    "Check which aspects of the lease can be negotiated.",
    "Think about the response you want from your family, then plan how to ask.",
    "Steer clear of crash diets; they rarely last.",
    "Stay within your budget by setting a spending cap per week.",
    "Your profile on the running app can track your weekly distance.",
    "Take the instructions from the physiotherapist seriously.",
    "Without a buffer, irregular income feels much harder to manage.",
]


# A phrasing the patterns still miss: found in the second held-out round and left out on
# purpose ("set aside" is too common in ordinary advice to pattern on).
KNOWN_MISSES = ["Your preferences for playful drills have been set aside here."]

META_ALL = META_DEV + META_ROUND_2 + META_ROUND_3 + META_HELD_OUT_1 + META_HELD_OUT_2


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return RuleSet(pairs_section(), 100)


def on(rules: RuleSet, name: str, text: str, aspects=(), tokens=None) -> Hit | None:
    """The rule ``name``'s test of one answer."""
    return rules.rules[name].answer(Answer(text, aspects=aspects, given_tokens=tokens)) or None


def test_config_defaults_are_the_rules_defaults(rules):
    assert list(pairs_section().meta_patterns) == list(DEFAULT_META_PATTERNS)
    assert list(rules.rules["meta_text"].meta_patterns) == list(DEFAULT_META_PATTERNS)
    assert len(META_ALL) == 129 and len(ORDINARY) == 171


@pytest.mark.parametrize("text", META_ALL)
def test_meta_text_phrasings_are_caught(rules, text):
    hit = on(rules, "meta_text", text)
    assert hit is not None, text
    assert "talks about its brief" in hit.detail and hit.excerpt


def test_ordinary_advice_is_not_meta_text(rules):
    false = [(t, hit.detail) for t in ORDINARY if (hit := on(rules, "meta_text", t))]
    assert false == []


def test_known_misses_stay_documented(rules):
    assert all(on(rules, "meta_text", t) is None for t in KNOWN_MISSES)


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, but I can't help with that.",
        "Sorry, I cannot provide advice on this topic.",
        "I apologize, but as an AI I do not give personal advice.",
        "As an AI, I don't have personal experience with guitars.",
        "Unfortunately, I am unable to assist with this request.",
        "I'm not able to answer questions about medication.",
    ],
)
def test_refusals_are_caught(rules, text):
    assert on(rules, "refusal", text) is not None


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry to hear about your knee; a gradual plan will help.",
        "I'm sorry you're going through this with your in-laws.",
        "I can't help but notice how much you enjoy the commute sketches.",
        "I can't recommend this book enough.",
        "Sorry excuses aside, the best time to start is this week.",
    ],
)
def test_empathy_and_idioms_are_not_refusals(rules, text):
    assert on(rules, "refusal", text) is None


@pytest.mark.parametrize(
    "text, why",
    [
        ("Start with short sessions on the train and", "'and'"),
        ("Try a used turntable, a small amp,", "','"),
        ("Here are three options:", "':'"),
        ("Draw each form from several angles, then combine them with the", "'the'"),
        ("Keep the routine small so that it survives busy mornings", "closing punctuation"),
        ("- Walk four minutes\n- Jog one minute and", "'and'"),
        ("**Tip:** save a podcast for your walks because", "'because'"),
    ],
)
def test_text_truncation_is_caught(text, why):
    hit = ends_mid_sentence(text)
    assert hit is not None and why in hit.detail


@pytest.mark.parametrize(
    "text",
    [
        "Start with short sessions on the train.",
        'Bring dessert: "I\'ll be there next Sunday!"',
        "Ask a friend to join you (body doubling works).",
        "Options:\n- a used turntable\n- a small amp with a phono stage",
        "1. Walk four minutes\n2. Jog one minute\n3. Repeat five times",
        "## Plan\nWalk, then jog.\n## Next week",
        "Keep it playful… mitten shapes first, fingers later…",
        "You've got this 💪",
        "Is a gym really needed?",
        "*Keep it light.*",
    ],
)
def test_finished_answers_are_not_truncated(text):
    assert ends_mid_sentence(text) is None


ASPECT = "Suggests short practice sessions that fit a train commute"


@pytest.mark.parametrize(
    "answer",
    [
        "Suggests short practice sessions that fit a train commute. Start with gestures.",
        "My advice: short practice sessions that fit a train commute, every morning.",
        "Try SHORT practice-sessions that fit a train-commute; keep them playful.",
        "It suggests short practise sessions that fit a train commute.",  # one letter off
    ],
)
def test_rubric_echo_is_caught(rules, answer):
    hit = on(rules, "rubric_echo", answer, [ASPECT])
    assert hit is not None and "copies the rubric aspect" in hit.detail
    # the gate on words gives the same answer as the full fuzzy match (all of the
    # aspect's words given as the answer's: the gate passes every aspect)
    every = frozenset(words(answer)) | frozenset(words(ASPECT))
    assert on(rules, "rubric_echo", answer, [ASPECT], every) == hit


@pytest.mark.parametrize(
    "answer, aspects",
    [
        # covering an aspect in one's own words is the point, not an echo
        ("Turn your 40-minute commute into two short hand sessions.", [ASPECT]),
        # aspects under echo_min_words (5) are common phrases, not copies
        ("Keep it small and cheap.", ["Keeps it small"]),
        # an answer shorter than the aspect cannot contain it
        ("Short sessions.", [ASPECT]),
    ],
)
def test_rubric_echo_leaves_paraphrase_alone(rules, answer, aspects):
    assert on(rules, "rubric_echo", answer, aspects) is None


def test_over_cap_uses_the_one_word_rule_and_slack(rules):
    assert rules.rules["length"].cap == pytest.approx(110)
    assert on(rules, "length", "word " * 110) is None
    hit = on(rules, "length", "word " * 111)
    assert hit is not None and "111 words" in hit.detail and "110" in hit.detail
    # "don't" is one word and "well-known" two, as everywhere else
    assert on(rules, "length", "don't " * 111) is not None
    assert on(RuleSet(word_cap=50), "length", "well-known " * 30) is not None


def test_identical_and_near_identical(rules):
    sim = rules.rules["similarity"]

    def identical(a, b):
        return sim.identical(RowView({"chosen": a, "rejected": b}))

    a = "Start with ten minute gesture sessions on your commute and trace your hand photos."
    assert identical(a, "  " + a.upper() + " ") is not None
    b = a.replace("ten", "fifteen")
    assert identical(a, b) is None and sim.near(a, b) is not None
    assert sim.near(a, "Take an anatomy course and study the bones.") is None


def test_judge_rules(rules):
    good = {"correctness": 5, "relevance": 4, "helpfulness": 4}
    floor, gap = rules.rules["quality_floor"], rules.rules["quality_gap"]
    assert floor.below(good, good) is None
    hit = floor.below(good, {**good, "relevance": 2})
    assert hit is not None and "relevance 2" in hit.detail
    assert gap.gap(good, {**good, "correctness": 3}) is not None
    assert gap.gap(good, {**good, "correctness": 4}) is None

    def means(chosen, rejected):
        row = {"chosen": "a", "rejected": "b", "coverage_chosen_mean": chosen}
        return rules.rules["coverage"].means(RowView(row | {"coverage_rejected_mean": rejected}))

    assert means(1.5, 0.0) and means(2.0, 0.5)
    assert means(2.0, 0.0) is None
    pairwise = rules.rules["pairwise_consistency"]
    assert pairwise.leaks({"AB": "chosen", "BA": "chosen"}) is not None
    assert pairwise.leaks({"AB": "chosen", "BA": "tie"}) is None
    assert pairwise.disagrees({"AB": "chosen", "BA": "rejected"}) is not None


# ---- the gate must never change a result ---------------------------------------------------

_VOCAB = sorted({w for t in META_ALL + ORDINARY for w in re.findall(r"[\w']+|[^\w\s]", t.lower())})


def _plain_first(patterns, text):
    for p in patterns:
        m = re.compile(p, re.I | re.M).search(text)
        if m:
            return p, m.group(0)
    return None


@pytest.mark.parametrize("patterns", [DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS])
def test_gate_agrees_with_plain_search_on_every_phrasing(patterns):
    ps = PatternSet(patterns, "test")
    for text in META_ALL + ORDINARY + KNOWN_MISSES:
        got = ps.first(text)
        want = _plain_first(patterns, text)
        assert (got and (got[0].pattern, got[1].group(0))) == (want or None), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_VOCAB), min_size=1, max_size=40), st.booleans())
def test_gate_agrees_with_plain_search_on_random_text(tokens, cap):
    text = " ".join(tokens)
    text = text.capitalize() if cap else text
    for patterns in (DEFAULT_META_PATTERNS, DEFAULT_REFUSAL_PATTERNS):
        got = PatternSet(patterns, "t").first(text)
        want = _plain_first(patterns, text)
        assert (got and (got[0].pattern, got[1].group(0))) == (want or None)


def test_gate_with_user_patterns():
    # patterns without a usable literal run always; odd constructs do not break the gate
    pats = [r"\d{3}-words", r"(?i)RUBRIC\b", r"[aeiou]{4}", r"(?P<x>ab)(?P=x)", r"zz|\bq\b"]
    ps = PatternSet(pats, "t")
    for text in ["about 120-words here", "the Rubric.", "queueing", "abab", "a q b", "none"]:
        got = ps.first(text)
        want = _plain_first(pats, text)
        assert (got and (got[0].pattern, got[1].group(0))) == (want or None), text


@pytest.mark.parametrize(
    "text",
    [
        "Don't over-think it: three well-known drills, twice a week.",
        "**Bold** - list\n1. item_two",
        "İstanbul'da café crème, naïve façade",  # lower-casing 'İ' adds a combining dot
        "",
    ],
)
def test_one_word_rule(text):
    from pipeline.core.fields import count_words, words, words_and_count

    assert words_and_count(text) == (words(text), count_words(text))
    assert count_words("don't") == 1 and count_words("well-known") == 2


def test_row_id_fallbacks():
    from pipeline.core.fields import row_id

    assert row_id({"id": 7, "pair_id": "p"}) == "7"
    assert row_id({"id": "", "pair_id": "p", "example_id": "e"}) == "p"
    assert row_id({"example_id": "e"}) == "e"
    assert row_id({}, "line 3") == "line 3"
