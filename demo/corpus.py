"""Synthetic conversations that teach the demo target to reason, call tools and write code.

Three kinds, built from small closed vocabularies so that a tiny model can learn them:
`function_calling` (a tool call, or a short answer once the tool has returned), `code` (a long
program) and `chat` (a medium prose answer). Every reply is a function of words in the prompt (the
city, the function name, the task), never of chance: greedy decoding is then deterministic and a
drafter has something real to predict.

Conversations come in two splits. `train` varies what does not change the reply (system prompts,
earlier turns, thinking switched off); `demo` has the shape the demo prompt files carry. A user
request whose hash falls in the demo bucket is never used for training, so demo prompts are unseen.
"""

from __future__ import annotations

import functools
import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar


class _Drawn(Protocol):
    @property
    def request(self) -> str: ...


T = TypeVar("T", bound=_Drawn)

KINDS = ("function_calling", "code", "chat")
SPLITS = ("train", "demo")
DEMO_BUCKETS = 8  # one request text in DEMO_BUCKETS is reserved for the demo split

GLAIVE_SYSTEM = (
    "You are a helpful assistant with access to the following functions. Use them if required"
)
GENERIC_SYSTEMS = (
    "You are a helpful assistant.",
    "You are a friendly and knowledgeable assistant.",
    "You are a careful assistant. Think before you answer.",
)


@dataclass(frozen=True)
class Conversation:
    """Canonical OpenAI-style messages; the last message is the assistant reply to learn."""

    kind: str
    messages: list[dict]
    tools: list[dict] | None = None
    thinking: bool = True  # False: the prompt closes reasoning (`<think></think>`), reply has none

    @property
    def prompt(self) -> list[dict]:
        return self.messages[:-1]

    @property
    def reply(self) -> dict:
        return self.messages[-1]

    @property
    def request(self) -> str:
        """The last user message: what decides the split."""
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")


def in_demo_split(request: str) -> bool:
    return zlib.crc32(request.encode()) % DEMO_BUCKETS == 0


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def _draw(rng: random.Random, split: str, make: Callable[[random.Random], T]) -> T:
    """Draw from `make` until the drawn request belongs to `split`."""
    _check_split(split)
    while True:
        drawn = make(rng)
        if in_demo_split(drawn.request) == (split == "demo"):
            return drawn


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Exchange:
    """A request and the reply it always gets (code and chat)."""

    request: str
    reasoning: str
    answer: str


def _single_turn(kind: str, rng: random.Random, split: str, exchange: Exchange) -> Conversation:
    """The exchange as a conversation; training adds a system prompt to some."""
    system = None if split == "demo" else rng.choice((None, None, None) + GENERIC_SYSTEMS)
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": exchange.request},
        {"role": "assistant", "reasoning_content": exchange.reasoning, "content": exchange.answer},
    ]
    return Conversation(kind, messages)


# ---------------------------------------------------------------------------------------------
# function_calling: one scenario per tool; each knows its request, arguments, result and answer.

CITIES = (
    "Paris",
    "London",
    "Tokyo",
    "Berlin",
    "Madrid",
    "Rome",
    "Cairo",
    "Sydney",
    "Toronto",
    "Chicago",
    "Mumbai",
    "Seoul",
    "Lisbon",
    "Vienna",
    "Dublin",
    "Oslo",
)


@dataclass(frozen=True)
class Scenario:
    request: str
    function: str
    arguments: dict
    plan: str  # reasoning before the call
    result: dict
    summary: str  # reasoning once the result is in
    answer: str


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """A function definition as Glaive writes it (name, description, JSON-schema parameters)."""
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }


def _param(kind: str, description: str, **extra) -> dict:
    return {"type": kind, **extra, "description": description}


FUNCTIONS = {
    f["name"]: f
    for f in (
        _tool(
            "get_weather",
            "Get the current weather for a city",
            {
                "city": _param("string", "The name of the city"),
                "unit": _param("string", "The temperature unit", enum=["celsius", "fahrenheit"]),
            },
            ["city"],
        ),
        _tool(
            "convert_currency",
            "Convert an amount of money from one currency to another",
            {
                "amount": _param("number", "The amount of money to convert"),
                "from_currency": _param("string", "The currency code to convert from"),
                "to_currency": _param("string", "The currency code to convert to"),
            },
            ["amount", "from_currency", "to_currency"],
        ),
        _tool(
            "search_restaurants",
            "Search for restaurants in a city by cuisine",
            {
                "city": _param("string", "The city to search in"),
                "cuisine": _param("string", "The type of food"),
            },
            ["city", "cuisine"],
        ),
        _tool(
            "calculate_bmi",
            "Calculate the body mass index",
            {
                "weight": _param("number", "The weight in kilograms"),
                "height": _param("number", "The height in meters"),
            },
            ["weight", "height"],
        ),
        _tool(
            "get_stock_price",
            "Get the latest stock price of a company",
            {
                "symbol": _param("string", "The stock ticker symbol, for example AAPL"),
            },
            ["symbol"],
        ),
        _tool(
            "send_email",
            "Send an email to a recipient",
            {
                "recipient": _param("string", "The email address of the recipient"),
                "subject": _param("string", "The subject of the email"),
                "body": _param("string", "The text of the email"),
            },
            ["recipient", "subject", "body"],
        ),
        _tool(
            "translate_text",
            "Translate a text into another language",
            {
                "text": _param("string", "The text to translate"),
                "target_language": _param("string", "The language to translate into"),
            },
            ["text", "target_language"],
        ),
        _tool(
            "calculate_tip",
            "Calculate the tip and the total for a bill",
            {
                "bill_amount": _param("number", "The amount of the bill"),
                "tip_percentage": _param("number", "The tip in percent"),
            },
            ["bill_amount", "tip_percentage"],
        ),
    )
}

CONDITIONS = {
    "sunny": "It is a good day to spend some time outside.",
    "cloudy": "It should stay dry, but a light jacket is a good idea.",
    "rainy": "You may want to take an umbrella.",
    "windy": "Hold on to your hat if you go out.",
    "snowy": "Dress warmly and watch out for icy streets.",
}


def _weather(rng: random.Random) -> Scenario:
    city = rng.choice(CITIES)
    unit = rng.choice((None, None, "celsius", "fahrenheit"))
    if unit is None:
        request = rng.choice(
            (
                "What is the weather like in {city} right now?",
                "Can you check the current weather in {city}?",
                "I am flying to {city} tomorrow. How is the weather there?",
                "Is it raining in {city} today?",
                "How warm is it in {city} at the moment?",
            )
        )
    else:
        request = rng.choice(
            (
                "Tell me the temperature in {city} in {unit}.",
                "What is the weather in {city}? Please give the temperature in {unit}.",
                "How hot is it in {city} today, in {unit}?",
            )
        )
    arguments = {"city": city} | ({"unit": unit} if unit else {})
    unit = unit or "celsius"
    temperature = rng.randint(-5, 35) if unit == "celsius" else rng.randint(25, 95)
    condition = rng.choice(tuple(CONDITIONS))
    with_unit = f" and the unit {unit}" if "unit" in arguments else ""
    return Scenario(
        request=request.format(city=city, unit=unit),
        function="get_weather",
        arguments=arguments,
        plan=f"The user wants the current weather in {city}. The get_weather function returns it, "
        f"so I will call it with the city {city}{with_unit}.",
        result={"city": city, "temperature": temperature, "unit": unit, "condition": condition},
        summary=f"The get_weather function returned {temperature} degrees {unit} and {condition} "
        f"weather for {city}. I will pass this on with a short tip.",
        answer=f"Right now it is {temperature} degrees {unit} and {condition} in {city}. "
        f"{CONDITIONS[condition]}",
    )


RATES_TO_USD = {
    "USD": 1.0,
    "EUR": 1.08,
    "GBP": 1.27,
    "JPY": 0.0067,
    "CHF": 1.12,
    "CAD": 0.74,
    "AUD": 0.66,
    "INR": 0.012,
}


def _currency(rng: random.Random) -> Scenario:
    amount = rng.choice((20, 50, 100, 150, 200, 250, 500, 750, 1000, 2000))
    source, target = rng.sample(tuple(RATES_TO_USD), 2)
    request = rng.choice(
        (
            "How much is {amount} {source} in {target}?",
            "Please convert {amount} {source} to {target}.",
            "I need to change {amount} {source} into {target}. Can you help?",
            "What do I get for {amount} {source} in {target} today?",
        )
    ).format(amount=amount, source=source, target=target)
    converted = round(amount * RATES_TO_USD[source] / RATES_TO_USD[target], 2)
    return Scenario(
        request=request,
        function="convert_currency",
        arguments={"amount": amount, "from_currency": source, "to_currency": target},
        plan=f"The user wants to convert {amount} {source} to {target}. I will call "
        f"convert_currency with the amount {amount}, from {source} to {target}.",
        result={"converted_amount": converted, "from_currency": source, "to_currency": target},
        summary=f"The conversion returned {converted} {target}. I will give the user the result.",
        answer=f"{amount} {source} is about {converted} {target} at the current exchange rate.",
    )


CUISINES = ("Italian", "Japanese", "Mexican", "Indian", "Thai", "French", "Chinese", "Greek")
RESTAURANTS = (
    "The Golden Spoon",
    "Casa Verde",
    "Blue Lantern",
    "The Olive Tree",
    "Red Pepper",
    "Little Garden",
    "The Corner Table",
    "Silver Moon",
    "Harbor House",
    "The Green Door",
)


def _restaurants(rng: random.Random) -> Scenario:
    city, cuisine = rng.choice(CITIES), rng.choice(CUISINES)
    request = rng.choice(
        (
            "Find me a {cuisine} restaurant in {city}.",
            "I am hungry for {cuisine} food in {city}. Any suggestions?",
            "Where can I eat {cuisine} food in {city}?",
            "Can you recommend a good {cuisine} place in {city}?",
        )
    ).format(city=city, cuisine=cuisine)
    first, second = rng.sample(RESTAURANTS, 2)
    ratings = sorted((rng.randint(35, 50) / 10 for _ in range(2)), reverse=True)
    return Scenario(
        request=request,
        function="search_restaurants",
        arguments={"city": city, "cuisine": cuisine},
        plan=f"The user is looking for {cuisine} food in {city}. The search_restaurants function "
        f"can find places, so I will search with the city {city} and the cuisine {cuisine}.",
        result={
            "restaurants": [
                {"name": first, "rating": ratings[0]},
                {"name": second, "rating": ratings[1]},
            ]
        },
        summary=f"The search found {first} and {second}. I will list both with their ratings.",
        answer=f"I found two {cuisine} restaurants in {city}: {first}, rated {ratings[0]}, and "
        f"{second}, rated {ratings[1]}. Enjoy your meal!",
    )


HEIGHTS = (1.55, 1.6, 1.65, 1.7, 1.75, 1.8, 1.85, 1.9)


def _bmi(rng: random.Random) -> Scenario:
    weight, height = rng.randint(45, 110), rng.choice(HEIGHTS)
    request = rng.choice(
        (
            "I weigh {weight} kilograms and I am {height} meters tall. What is my BMI?",
            "Calculate my BMI please: weight {weight} kg, height {height} m.",
            "What is the body mass index for someone who is {height} meters tall and weighs "
            "{weight} kg?",
        )
    ).format(weight=weight, height=height)
    bmi = round(weight / height**2, 1)
    category = (
        "underweight"
        if bmi < 18.5
        else "normal"
        if bmi < 25
        else "overweight"
        if bmi < 30
        else "obese"
    )
    return Scenario(
        request=request,
        function="calculate_bmi",
        arguments={"weight": weight, "height": height},
        plan=f"The user wants a BMI for {weight} kilograms and {height} meters. I will call "
        f"calculate_bmi with the weight {weight} and the height {height}.",
        result={"bmi": bmi, "category": category},
        summary=f"The function returned a BMI of {bmi}, in the {category} category.",
        answer=f"Your BMI is {bmi}, which falls in the {category} range. BMI is only a rough "
        f"guide, so talk to a doctor for a full picture.",
    )


COMPANIES = {
    "Apple": "AAPL",
    "Microsoft": "MSFT",
    "Google": "GOOGL",
    "Amazon": "AMZN",
    "Tesla": "TSLA",
    "Nvidia": "NVDA",
    "Netflix": "NFLX",
    "IBM": "IBM",
}


def _stock(rng: random.Random) -> Scenario:
    company = rng.choice(tuple(COMPANIES))
    symbol = COMPANIES[company]
    request = rng.choice(
        (
            "What is the current stock price of {company}?",
            "How much does one {company} share cost right now?",
            "Can you look up the {company} stock price for me?",
        )
    ).format(company=company)
    price = rng.randint(5000, 90000) / 100
    return Scenario(
        request=request,
        function="get_stock_price",
        arguments={"symbol": symbol},
        plan=f"The user asks for the stock price of {company}, whose ticker symbol is {symbol}. "
        f"I will call get_stock_price with {symbol}.",
        result={"symbol": symbol, "price": price, "currency": "USD"},
        summary=f"The latest price of {symbol} is {price} dollars.",
        answer=f"{company} ({symbol}) is trading at {price} dollars per share right now.",
    )


PEOPLE = ("Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo")
EVENTS = ("team meeting", "project review", "dinner", "football match", "book club")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


def _email(rng: random.Random) -> Scenario:
    person, event, day = rng.choice(PEOPLE), rng.choice(EVENTS), rng.choice(DAYS)
    request = rng.choice(
        (
            "Send an email to {person} saying that the {event} is moved to {day}.",
            "Please email {person} that the {event} is moved to {day}.",
            "Can you let {person} know by email that the {event} is moved to {day}?",
        )
    ).format(person=person, event=event, day=day)
    address = f"{person.lower()}@example.com"
    return Scenario(
        request=request,
        function="send_email",
        arguments={
            "recipient": address,
            "subject": f"The {event} is moved to {day}",
            "body": f"Hi {person}, the {event} is moved to {day}. See you then!",
        },
        plan=f"The user wants to tell {person} that the {event} is moved to {day}. I will send an "
        f"email to {address} with a short subject and body.",
        result={"status": "sent", "recipient": address},
        summary=f"The email to {address} was sent.",
        answer=f"Done! I sent an email to {person} at {address} saying that the {event} is moved "
        f"to {day}.",
    )


TRANSLATIONS = {
    "good morning": {
        "French": "bonjour",
        "Spanish": "buenos días",
        "German": "guten Morgen",
        "Italian": "buongiorno",
    },
    "thank you very much": {
        "French": "merci beaucoup",
        "Spanish": "muchas gracias",
        "German": "vielen Dank",
        "Italian": "grazie mille",
    },
    "where is the train station": {
        "French": "où est la gare",
        "Spanish": "dónde está la estación",
        "German": "wo ist der Bahnhof",
        "Italian": "dov'è la stazione",
    },
    "how much does this cost": {
        "French": "combien ça coûte",
        "Spanish": "cuánto cuesta esto",
        "German": "wie viel kostet das",
        "Italian": "quanto costa questo",
    },
    "I would like a coffee": {
        "French": "je voudrais un café",
        "Spanish": "quisiera un café",
        "German": "ich hätte gern einen Kaffee",
        "Italian": "vorrei un caffè",
    },
}


def _translate(rng: random.Random) -> Scenario:
    phrase = rng.choice(tuple(TRANSLATIONS))
    language = rng.choice(("French", "Spanish", "German", "Italian"))
    request = rng.choice(
        (
            'How do you say "{phrase}" in {language}?',
            'Translate "{phrase}" into {language}, please.',
            'What is "{phrase}" in {language}?',
        )
    ).format(phrase=phrase, language=language)
    translation = TRANSLATIONS[phrase][language]
    return Scenario(
        request=request,
        function="translate_text",
        arguments={"text": phrase, "target_language": language},
        plan=f'The user wants "{phrase}" in {language}. I will call translate_text with that text '
        f"and the target language {language}.",
        result={"translation": translation, "language": language},
        summary=f'The translation into {language} is "{translation}".',
        answer=f'In {language}, "{phrase}" is "{translation}".',
    )


def _tip(rng: random.Random) -> Scenario:
    bill, percent = rng.choice((20, 35, 40, 60, 80, 120, 150, 200)), rng.choice((10, 15, 18, 20))
    request = rng.choice(
        (
            "My bill is {bill} dollars. How much should I tip at {percent} percent?",
            "What is a {percent} percent tip on a {bill} dollar bill?",
            "Help me work out a {percent} percent tip for a bill of {bill} dollars.",
        )
    ).format(bill=bill, percent=percent)
    tip = round(bill * percent / 100, 2)
    total = round(bill + tip, 2)
    return Scenario(
        request=request,
        function="calculate_tip",
        arguments={"bill_amount": bill, "tip_percentage": percent},
        plan=f"The user wants a {percent} percent tip on {bill} dollars. I will call calculate_tip "
        f"with the bill amount {bill} and the tip percentage {percent}.",
        result={"tip_amount": tip, "total_amount": total},
        summary=f"The tip is {tip} and the total is {total}.",
        answer=f"A {percent} percent tip on {bill} dollars is {tip} dollars, so you pay {total} "
        f"dollars in total.",
    )


SCENARIOS = (_weather, _currency, _restaurants, _bmi, _stock, _email, _translate, _tip)


def _tool_call_id(rng: random.Random, split: str, name: str) -> str:
    """Kimi's own form in the demo (what the Glaive adapter writes); in training, the forms other
    sources use too, since the reply must not depend on it."""
    kimi = f"functions.{name}:0"
    if split == "demo":
        return kimi
    return rng.choice((kimi, name, "call_0", f"call_{rng.getrandbits(32):08x}"))


def function_calling(
    rng: random.Random, split: str = "train", with_result: bool | None = None
) -> Conversation:
    """A tool-use conversation: the reply calls a tool, or (`with_result`) answers from the
    tool's result."""
    scenario = _draw(rng, split, lambda r: r.choice(SCENARIOS)(r))
    if with_result is None:
        with_result = rng.random() < 0.4
    offered = [scenario.function] + rng.sample(
        [n for n in FUNCTIONS if n != scenario.function], rng.choice((0, 0, 1, 1, 2))
    )
    rng.shuffle(offered)
    tools = [{"type": "function", "function": FUNCTIONS[n]} for n in offered]

    system = (
        GLAIVE_SYSTEM
        if split == "demo"
        else rng.choice((GLAIVE_SYSTEM, GLAIVE_SYSTEM, GLAIVE_SYSTEM, GENERIC_SYSTEMS[0], None))
    )
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": scenario.request})
    call_id = _tool_call_id(rng, split, scenario.function)
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": scenario.function, "arguments": json.dumps(scenario.arguments)},
    }
    if with_result:
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": scenario.function,
                "content": _dumps(scenario.result),
            },
            {
                "role": "assistant",
                "reasoning_content": scenario.summary,
                "content": scenario.answer,
            },
        ]
    else:
        messages.append(
            {
                "role": "assistant",
                "reasoning_content": scenario.plan,
                "content": "",
                "tool_calls": [call],
            }
        )
    return Conversation("function_calling", messages, tools)


# ---------------------------------------------------------------------------------------------
# code: a closed set of programming tasks; the function name and the options come from the prompt.


@dataclass(frozen=True)
class CodeTask:
    names: tuple[str, ...]  # the prompt picks one; the program uses it
    summary: str  # completes "a function that ..."
    params: str
    typed_params: str
    returns: str
    doc: str
    body: str  # at zero indentation; "{name}" stands for the function's name
    example: str  # call with "{name}"; the program prints its value
    plan: str
    explanation: str


CODE_TASKS = (
    CodeTask(
        names=("is_prime", "check_prime"),
        summary="checks whether an integer is a prime number",
        params="n",
        typed_params="n: int",
        returns="bool",
        doc="Return True if n is a prime number, otherwise False.",
        body="""\
if n < 2:
    return False
if n % 2 == 0:
    return n == 2
divisor = 3
while divisor * divisor <= n:
    if n % divisor == 0:
        return False
    divisor += 2
return True""",
        example="{name}(29)",
        plan="Numbers below two are not prime and even numbers other than two are not prime, so "
        "for the rest it is enough to try odd divisors up to the square root.",
        explanation="The loop only tries odd divisors up to the square root of n, so the "
        "function runs in O(sqrt(n)) time and uses constant memory.",
    ),
    CodeTask(
        names=("fibonacci", "fib_sequence"),
        summary="returns a list with the first n Fibonacci numbers",
        params="n",
        typed_params="n: int",
        returns="list[int]",
        doc="Return the first n Fibonacci numbers, starting from 0.",
        body="""\
if n < 0:
    raise ValueError("n must not be negative")
numbers = []
current, following = 0, 1
for _ in range(n):
    numbers.append(current)
    current, following = following, current + following
return numbers""",
        example="{name}(8)",
        plan="I can build the sequence iteratively with two running values, which avoids the "
        "exponential cost of the naive recursion, and reject negative input.",
        explanation="Each step appends the current number and shifts the pair forward, so the "
        "function takes O(n) time instead of the exponential time of plain recursion.",
    ),
    CodeTask(
        names=("reverse_words", "flip_words"),
        summary="reverses the order of the words in a sentence",
        params="sentence",
        typed_params="sentence: str",
        returns="str",
        doc="Return the sentence with its words in reverse order.",
        body="""\
if not isinstance(sentence, str):
    raise TypeError("sentence must be a string")
words = sentence.split()
reversed_words = []
for index in range(len(words) - 1, -1, -1):
    reversed_words.append(words[index])
return " ".join(reversed_words)""",
        example='{name}("the quick brown fox")',
        plan="Splitting on whitespace gives the words, and walking them from the last index to "
        "the first builds the reversed list, which I join back with single spaces.",
        explanation="Splitting on whitespace also collapses repeated spaces, and the loop walks "
        "the words from the end, so the function runs in linear time.",
    ),
    CodeTask(
        names=("count_vowels", "vowel_count"),
        summary="counts the vowels in a string",
        params="text",
        typed_params="text: str",
        returns="int",
        doc="Return how many vowels the text contains.",
        body="""\
vowels = set("aeiouAEIOU")
count = 0
for char in text:
    if char in vowels:
        count += 1
return count""",
        example='{name}("Speculative decoding")',
        plan="A set of upper and lower case vowels makes each membership test constant time, so "
        "one pass over the characters with a counter is enough.",
        explanation="The set of vowels covers both cases, so the function counts in a single "
        "pass over the text in O(n) time.",
    ),
    CodeTask(
        names=("binary_search", "find_index"),
        summary="returns the index of a target value in a sorted list, or -1 when it is missing",
        params="items, target",
        typed_params="items: list[int], target: int",
        returns="int",
        doc="Return the index of target in the sorted list items, or -1 if it is absent.",
        body="""\
low, high = 0, len(items) - 1
while low <= high:
    middle = (low + high) // 2
    if items[middle] == target:
        return middle
    if items[middle] < target:
        low = middle + 1
    else:
        high = middle - 1
return -1""",
        example="{name}([1, 3, 5, 7, 9, 11], 7)",
        plan="Because the list is sorted, I can keep a low and a high bound and halve the range "
        "at every step by comparing the middle element with the target.",
        explanation="Every comparison halves the search range, so the function needs O(log n) "
        "steps and returns -1 when the range becomes empty.",
    ),
    CodeTask(
        names=("merge_sorted", "merge_lists"),
        summary="merges two sorted lists into one sorted list",
        params="left, right",
        typed_params="left: list[int], right: list[int]",
        returns="list[int]",
        doc="Merge two sorted lists into a new sorted list.",
        body="""\
merged = []
i = j = 0
while i < len(left) and j < len(right):
    if left[i] <= right[j]:
        merged.append(left[i])
        i += 1
    else:
        merged.append(right[j])
        j += 1
merged.extend(left[i:])
merged.extend(right[j:])
return merged""",
        example="{name}([1, 4, 9], [2, 3, 10])",
        plan="Two indexes walk both lists at once and always take the smaller head, and at the "
        "end whatever remains in either list is appended.",
        explanation="Each element is appended exactly once, so the merge runs in O(n + m) time, "
        "and using <= keeps equal elements in a stable order.",
    ),
    CodeTask(
        names=("is_palindrome", "check_palindrome"),
        summary="checks whether a string reads the same forwards and backwards, ignoring case "
        "and punctuation",
        params="text",
        typed_params="text: str",
        returns="bool",
        doc="Return True if text is a palindrome when case and punctuation are ignored.",
        body="""\
letters = [char.lower() for char in text if char.isalnum()]
left, right = 0, len(letters) - 1
while left < right:
    if letters[left] != letters[right]:
        return False
    left += 1
    right -= 1
return True""",
        example='{name}("Never odd or even")',
        plan="First I keep only the letters and digits in lower case, then two pointers move "
        "inwards from both ends and compare characters.",
        explanation="Filtering first means spaces and punctuation never matter, and the two "
        "pointers stop at the middle, so the check is linear in the length of the text.",
    ),
    CodeTask(
        names=("word_frequencies", "count_words"),
        summary="counts how often each word appears in a text",
        params="text",
        typed_params="text: str",
        returns="dict[str, int]",
        doc="Return a dictionary that maps each word to the number of times it appears.",
        body="""\
counts = {}
for word in text.lower().split():
    word = word.strip(".,!?;:")
    if word:
        counts[word] = counts.get(word, 0) + 1
return counts""",
        example='{name}("the cat saw the dog")',
        plan="I lower-case the text, split it into words, strip punctuation from each word and "
        "count them in a dictionary.",
        explanation="Lower-casing and stripping punctuation make words like The and the count "
        "as one word, and the dictionary keeps the order in which words first appear.",
    ),
    CodeTask(
        names=("flatten", "flatten_list"),
        summary="flattens a nested list into a single flat list",
        params="items",
        typed_params="items: list",
        returns="list",
        doc="Return a flat list with every element of the nested list items.",
        body="""\
flat = []
for item in items:
    if isinstance(item, list):
        flat.extend({name}(item))
    else:
        flat.append(item)
return flat""",
        example="{name}([1, [2, [3, 4]], 5])",
        plan="A recursive function fits here: plain elements are appended and nested lists are "
        "flattened by calling the function again.",
        explanation="The recursion goes as deep as the nesting, and every element is visited "
        "once, so the function runs in time linear in the number of elements.",
    ),
    CodeTask(
        names=("gcd", "greatest_common_divisor"),
        summary="computes the greatest common divisor of two integers with the Euclidean algorithm",
        params="a, b",
        typed_params="a: int, b: int",
        returns="int",
        doc="Return the greatest common divisor of a and b.",
        body="""\
a, b = abs(a), abs(b)
while b != 0:
    a, b = b, a % b
return a""",
        example="{name}(84, 36)",
        plan="The Euclidean algorithm replaces the pair by the smaller number and the remainder "
        "until the remainder is zero, and taking absolute values first handles negative input.",
        explanation="Each step at least halves the larger number every two iterations, so the "
        "algorithm needs only O(log min(a, b)) steps.",
    ),
    CodeTask(
        names=("is_balanced", "check_brackets"),
        summary="checks whether the brackets in a string are balanced",
        params="text",
        typed_params="text: str",
        returns="bool",
        doc="Return True if every bracket in text is closed in the right order.",
        body="""\
pairs = {")": "(", "]": "[", "}": "{"}
stack = []
for char in text:
    if char in "([{":
        stack.append(char)
    elif char in pairs:
        if not stack or stack.pop() != pairs[char]:
            return False
return not stack""",
        example='{name}("{[()()]}")',
        plan="A stack is the classic tool: push every opening bracket and, for every closing "
        "bracket, pop and check that it matches.",
        explanation="The stack holds the brackets that are still open, so a mismatch or a "
        "leftover opening bracket means the string is not balanced.",
    ),
    CodeTask(
        names=("max_subarray_sum", "largest_sum"),
        summary="finds the largest sum of a contiguous subarray",
        params="numbers",
        typed_params="numbers: list[int]",
        returns="int",
        doc="Return the largest sum of any contiguous, non-empty part of numbers.",
        body="""\
if not numbers:
    raise ValueError("numbers must not be empty")
best = current = numbers[0]
for number in numbers[1:]:
    current = max(number, current + number)
    best = max(best, current)
return best""",
        example="{name}([-2, 1, -3, 4, -1, 2, 1, -5, 4])",
        plan="Kadane's algorithm keeps the best sum ending at the current position and the best "
        "sum seen so far, in one pass.",
        explanation="This is Kadane's algorithm: it either extends the current run or starts a "
        "new one at each number, which gives the answer in O(n) time.",
    ),
    CodeTask(
        names=("remove_duplicates", "unique_items"),
        summary="removes duplicates from a list while keeping the original order",
        params="items",
        typed_params="items: list",
        returns="list",
        doc="Return the items without duplicates, in the order they first appear.",
        body="""\
seen = set()
unique = []
for item in items:
    if item not in seen:
        seen.add(item)
        unique.append(item)
return unique""",
        example="{name}([3, 1, 3, 2, 1])",
        plan="A set remembers what has been seen and a list keeps the order, so one pass keeps "
        "the first copy of every item.",
        explanation="The set makes each membership test constant time, so the function runs in "
        "O(n) time and keeps the first occurrence of every item.",
    ),
    CodeTask(
        names=("to_roman", "int_to_roman"),
        summary="converts a positive integer to a Roman numeral",
        params="number",
        typed_params="number: int",
        returns="str",
        doc="Return the Roman numeral for a positive integer.",
        body="""\
if number <= 0:
    raise ValueError("number must be positive")
values = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
    (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
result = []
for value, symbol in values:
    while number >= value:
        result.append(symbol)
        number -= value
return "".join(result)""",
        example="{name}(1994)",
        plan="A table of values from largest to smallest, including the subtractive pairs like "
        "CM and IV, lets a greedy loop build the numeral.",
        explanation="Listing the subtractive pairs such as CM and IV in the table lets the "
        "greedy loop produce the standard numeral without special cases.",
    ),
)

OPTIONS = {  # option -> (ways the prompt asks for it, how the reasoning names it)
    "typed": (("Use type hints.", "Please add type annotations."), "type hints"),
    "documented": (
        ("Include a docstring.", "Document the function with a docstring."),
        "a docstring",
    ),
    "example": (("Show an example call.", "Add a short usage example."), "an example call"),
}
INSTRUCTIONS = (
    "Write a Python function `{name}` that {summary}.",
    "Implement a Python function named `{name}` that {summary}.",
    "I need a Python function called `{name}` that {summary}.",
    "Create a function `{name}` in Python that {summary}.",
)
PROBLEMS = (
    "You are tasked with implementing a Python function `{name}` that {summary}. For example, "
    "`{example}` should return `{value}`.",
    "Your task is to write a Python function `{name}` that {summary}. The function will be "
    "tested with calls such as `{example}`, which should give `{value}`.",
)
PHRASINGS = {"instruction": INSTRUCTIONS, "problem": PROBLEMS}


def program(task: CodeTask, name: str, options: frozenset[str]) -> str:
    """The Python source the target writes for `task` under `name` with the asked `options`."""
    params = task.typed_params if "typed" in options else task.params
    returns = f" -> {task.returns}" if "typed" in options else ""
    lines = [f"def {name}({params}){returns}:"]
    if "documented" in options:
        lines.append(f'    """{task.doc}"""')
    lines += ["    " + line for line in task.body.replace("{name}", name).splitlines()]
    if "example" in options:
        call = task.example.replace("{name}", name)
        lines += [
            "",
            "",
            'if __name__ == "__main__":',
            f"    print({call})  # {example_value(task, name)}",
        ]
    return "\n".join(lines)


@functools.cache
def example_value(task: CodeTask, name: str):
    """What the task's example call returns, found by running the program."""
    scope: dict = {}
    exec(program(task, name, frozenset()), scope)  # noqa: S102 - the corpus's own programs
    return eval(task.example.replace("{name}", name), scope)  # noqa: S307


def _code_exchange(rng: random.Random, phrasing: str) -> Exchange:
    task = rng.choice(CODE_TASKS)
    name = rng.choice(task.names)
    options = frozenset(o for o in OPTIONS if rng.random() < 0.5)
    call = task.example.replace("{name}", name)
    request = rng.choice(PHRASINGS[phrasing]).format(
        name=name, summary=task.summary, example=call, value=repr(example_value(task, name))
    )
    request = " ".join([request] + [rng.choice(OPTIONS[o][0]) for o in OPTIONS if o in options])
    extras = [OPTIONS[o][1] for o in OPTIONS if o in options]
    closing = (
        f"I will add {_join(extras)}."
        if extras
        else "I will keep the code plain, as the user asked for nothing extra."
    )
    return Exchange(
        request=request,
        reasoning=f"The user wants a Python function named {name} that {task.summary}. "
        f"{task.plan} {closing}",
        answer=f"Here is a Python function `{name}` that {task.summary}.\n\n```python\n"
        f"{program(task, name, options)}\n```\n\n{task.explanation}",
    )


def code(rng: random.Random, split: str = "train", phrasing: str | None = None) -> Conversation:
    """A programming request (an instruction, or a problem statement) and a long program."""
    phrasing = phrasing or rng.choice(tuple(PHRASINGS))
    exchange = _draw(rng, split, lambda r: _code_exchange(r, phrasing))
    return _single_turn("code", rng, split, exchange)


# ---------------------------------------------------------------------------------------------
# chat: explanations of a few topics, animal profiles and city guides, filled from small tables.


@dataclass(frozen=True)
class Topic:
    phrase: str  # completes "Can you explain ..."
    questions: tuple[str, ...]
    key_idea: str
    answer: str


TOPICS = (
    Topic(
        "why the sky is blue",
        ("Why is the sky blue?", "What makes the sky look blue during the day?"),
        "Rayleigh scattering of sunlight by the air",
        "Sunlight is made of many colours. When it enters the atmosphere, it hits tiny gas "
        "molecules that scatter short blue waves much more strongly than long red ones. This "
        "effect is called Rayleigh scattering. The scattered blue light reaches our eyes from "
        "every direction, so the whole sky looks blue. At sunrise and sunset the light travels "
        "through much more air, most of the blue is scattered away, and the sky turns orange "
        "and red.",
    ),
    Topic(
        "how rainbows form",
        ("How do rainbows form?", "Why do we see a rainbow after the rain?"),
        "how raindrops bend and reflect sunlight",
        "A rainbow forms when sunlight shines through raindrops. Each drop acts like a small "
        "prism: the light bends as it enters the drop, reflects off the back, and bends again "
        "as it leaves. Because each colour bends by a slightly different amount, white light "
        "spreads into red, orange, yellow, green, blue and violet. You see a rainbow when the "
        "sun is behind you and the rain is in front of you.",
    ),
    Topic(
        "how photosynthesis works",
        ("How does photosynthesis work?", "How do plants make food from sunlight?"),
        "how chlorophyll turns light, water and carbon dioxide into sugar",
        "Photosynthesis is how plants turn light into food. Inside their leaves, chlorophyll "
        "captures energy from sunlight. The plant uses that energy to combine water from its "
        "roots with carbon dioxide from the air. The result is glucose, a sugar the plant uses "
        "to grow, and oxygen, which it releases into the air. Almost all life on Earth depends "
        "on this process, because it makes both food and the oxygen we breathe.",
    ),
    Topic(
        "how vaccines protect us",
        ("How do vaccines work?", "Why do vaccines protect people from disease?"),
        "how the immune system remembers a germ",
        "A vaccine trains the immune system without causing the disease. It contains a "
        "harmless piece or a weakened form of a germ. The immune system reacts by making "
        "antibodies and memory cells that recognise it. If the real germ arrives later, those "
        "memory cells respond quickly and stop the infection before it makes you seriously "
        "ill. When many people are vaccinated, the germ also has fewer chances to spread.",
    ),
    Topic(
        "what causes the seasons",
        ("What causes the seasons?", "Why is it warmer in summer than in winter?"),
        "the tilt of the Earth's axis",
        "The seasons are caused by the tilt of the Earth's axis, not by its distance from the "
        "sun. The axis is tilted by about 23 degrees. For part of the year one hemisphere "
        "leans toward the sun, gets more direct sunlight and longer days, and has summer. Six "
        "months later it leans away, the light arrives at a lower angle, the days are "
        "shorter, and it has winter.",
    ),
    Topic(
        "how a compiler works",
        ("How does a compiler work?", "What does a compiler do with my code?"),
        "the stages from source text to machine code",
        "A compiler translates source code into a form the machine can run. First it reads "
        "the text and splits it into tokens. Then it parses the tokens into a syntax tree and "
        "checks names and types. Next it turns the tree into an intermediate form and "
        "optimises it, for example by removing code that is never used. Finally it generates "
        "machine code or bytecode for the target platform.",
    ),
    Topic(
        "what a black hole is",
        ("What is a black hole?", "How can a black hole trap light?"),
        "gravity so strong that light cannot escape",
        "A black hole is a region of space where gravity is so strong that nothing can "
        "escape, not even light. It forms when a very massive star collapses at the end of its "
        "life. The boundary around it is called the event horizon. We cannot see a black hole "
        "directly, but we can detect it by the way it pulls on nearby stars and heats the gas "
        "that falls toward it.",
    ),
    Topic(
        "what causes ocean tides",
        ("What causes ocean tides?", "Why does the sea rise and fall every day?"),
        "the pull of the moon on the oceans",
        "Tides are caused mainly by the gravity of the moon. The moon pulls on the ocean and "
        "raises a bulge of water on the side of the Earth facing it, and a second bulge on the "
        "opposite side. As the Earth turns, a coast passes through both bulges, so most places "
        "see two high tides and two low tides each day. The sun adds a smaller pull that makes "
        "some tides higher than others.",
    ),
    Topic(
        "how data travels across the internet",
        ("How does data travel across the internet?", "What happens when I load a web page?"),
        "packets and the routers that forward them",
        "Data on the internet travels in small packets. Your computer splits a message into "
        "packets, and each one carries the address of its destination. Routers pass the "
        "packets from network to network and choose the next step for each one. The packets "
        "may take different routes and arrive out of order. At the destination they are put "
        "back together, and any missing packet is sent again.",
    ),
    Topic(
        "what inflation is",
        ("What is inflation?", "Why do prices go up over time?"),
        "rising prices and how central banks respond",
        "Inflation is the general rise in prices over time, which means each unit of money "
        "buys a little less. It can happen when demand grows faster than the supply of goods, "
        "or when costs such as energy and wages go up. Central banks try to keep inflation low "
        "and steady, often around two percent a year, mainly by raising or lowering interest "
        "rates.",
    ),
    Topic(
        "how bees make honey",
        ("How do bees make honey?", "Where does honey come from?"),
        "nectar, enzymes and evaporation",
        "Bees make honey from the nectar of flowers. A worker bee collects nectar and stores "
        "it in a special stomach, where enzymes start to change it. Back at the hive, it "
        "passes the nectar to other bees, who place it into wax cells. The bees fan their "
        "wings to evaporate most of the water, and the thick liquid that remains is honey. "
        "Finally they seal each cell with a cap of wax.",
    ),
    Topic(
        "why we need sleep",
        ("Why do we need sleep?", "What happens to the body when we sleep?"),
        "how the body and the brain recover at night",
        "Sleep gives the body and the brain time to recover. During deep sleep the body "
        "repairs tissue and releases growth hormones. The brain sorts and stores the memories "
        "of the day, and it clears waste that builds up while we are awake. Without enough "
        "sleep, attention, mood and the immune system all suffer. Most adults need seven to "
        "nine hours each night.",
    ),
)
TOPIC_REQUESTS = (
    "Can you explain {phrase}?",
    "Please explain {phrase}.",
    "I would like to understand {phrase}.",
    "Tell me {phrase}.",
)


def _topic(rng: random.Random) -> Exchange:
    topic = rng.choice(TOPICS)
    request = rng.choice(
        topic.questions + tuple(t.format(phrase=topic.phrase) for t in TOPIC_REQUESTS)
    )
    return Exchange(
        request=request,
        reasoning=f"The user asks {topic.phrase}. The heart of the answer is {topic.key_idea}, "
        f"so I will explain that in plain words and keep it short.",
        answer=topic.answer,
    )


ANIMALS = {  # animal -> (habitat, diet, lifespan in years, surprising fact)
    "dolphin": (
        "warm oceans all around the world",
        "fish and squid",
        40,
        "it sleeps with one half of its brain at a time",
    ),
    "elephant": (
        "the savannas and forests of Africa and Asia",
        "grass, leaves and fruit",
        60,
        "it can recognise itself in a mirror",
    ),
    "penguin": (
        "the cold coasts of the southern hemisphere",
        "fish and krill",
        20,
        "it cannot fly but swims very fast",
    ),
    "owl": (
        "forests and fields on every continent except Antarctica",
        "mice and other small animals",
        10,
        "it can turn its head almost all the way around",
    ),
    "giraffe": (
        "the open savannas of Africa",
        "the leaves of acacia trees",
        25,
        "its tongue is about half a meter long",
    ),
    "octopus": ("rocky sea floors", "crabs and shellfish", 2, "it has three hearts and blue blood"),
    "kangaroo": (
        "the grasslands of Australia",
        "grass and shrubs",
        20,
        "it can cover eight meters in a single jump",
    ),
    "wolf": (
        "the forests and tundra of the northern hemisphere",
        "deer and other large animals",
        8,
        "it lives and hunts in family packs",
    ),
    "tortoise": (
        "dry grasslands and deserts",
        "grass, flowers and fruit",
        100,
        "it can go for weeks without drinking",
    ),
    "polar bear": (
        "the sea ice of the Arctic",
        "seals",
        25,
        "its skin is black under its white fur",
    ),
}
ANIMAL_REQUESTS = (
    "Tell me about the {animal}.",
    "What do you know about the {animal}?",
    "Give me some facts about the {animal}.",
    "I am writing a school report on the {animal}. What should I know?",
)


def _animal(rng: random.Random) -> Exchange:
    animal = rng.choice(tuple(ANIMALS))
    habitat, diet, years, fact = ANIMALS[animal]
    return Exchange(
        request=rng.choice(ANIMAL_REQUESTS).format(animal=animal),
        reasoning=f"The user wants to learn about the {animal}. I will cover where it lives, "
        f"what it eats, how long it lives and one surprising fact.",
        answer=f"The {animal} lives in {habitat}. It feeds mainly on {diet} and usually lives "
        f"for about {years} years in the wild. One surprising fact is that {fact}. Like many "
        f"wild animals, the {animal} depends on a healthy habitat, so protecting the places "
        f"where it lives is the best way to help it.",
    )


CITY_GUIDES = {  # city -> (country, main sight, local food, best season)
    "Paris": ("France", "the Eiffel Tower and the Louvre", "fresh croissants", "spring"),
    "London": ("England", "the British Museum", "fish and chips", "late spring"),
    "Tokyo": ("Japan", "the Senso-ji temple in Asakusa", "fresh sushi", "spring"),
    "Berlin": ("Germany", "the Brandenburg Gate", "a currywurst", "summer"),
    "Madrid": ("Spain", "the Prado museum", "tapas", "autumn"),
    "Rome": ("Italy", "the Colosseum", "cacio e pepe", "spring"),
    "Cairo": ("Egypt", "the pyramids of Giza", "koshari", "winter"),
    "Sydney": ("Australia", "the Opera House", "grilled seafood", "spring"),
    "Toronto": ("Canada", "the CN Tower", "a peameal bacon sandwich", "summer"),
    "Chicago": ("the United States", "Millennium Park", "deep dish pizza", "late summer"),
    "Mumbai": ("India", "the Gateway of India", "vada pav", "winter"),
    "Seoul": ("South Korea", "Gyeongbokgung Palace", "bibimbap", "autumn"),
    "Lisbon": ("Portugal", "the Belem Tower", "pastel de nata", "spring"),
    "Vienna": ("Austria", "Schonbrunn Palace", "a slice of Sachertorte", "spring"),
    "Dublin": ("Ireland", "Trinity College", "Irish stew", "summer"),
    "Oslo": ("Norway", "the Vigeland sculpture park", "smoked salmon", "summer"),
}
CITY_REQUESTS = (
    "I am visiting {city} next month. What should I see?",
    "Give me some travel tips for {city}.",
    "What should a first-time visitor do in {city}?",
    "I have three days in {city}. Any advice?",
)


def _city(rng: random.Random) -> Exchange:
    city = rng.choice(CITIES)
    country, sight, food, season = CITY_GUIDES[city]
    return Exchange(
        request=rng.choice(CITY_REQUESTS).format(city=city),
        reasoning=f"The user is planning a trip to {city}. I should mention the main sight, a "
        f"local dish and the best season to visit.",
        answer=f"{city} is a wonderful city in {country}. Start with {sight}, the most famous "
        f"sight in town, and go early to avoid the crowds. For food, try {food} at a small "
        f"local place. The best time to visit is {season}, when the weather is pleasant. Use "
        f"public transport to get around, and book popular places a few days ahead.",
    )


CHAT_EXCHANGES = (_topic, _animal, _city)
GREETINGS = ("", "", "Hi! ", "Hello. ", "Quick question: ")
SIGN_OFFS = ("", "", " Thanks!", " Thank you in advance.")


def _chat_exchange(rng: random.Random) -> Exchange:
    exchange = rng.choice(CHAT_EXCHANGES)(rng)
    request = rng.choice(GREETINGS) + exchange.request + rng.choice(SIGN_OFFS)
    return Exchange(request, exchange.reasoning, exchange.answer)


def chat(rng: random.Random, split: str = "train") -> Conversation:
    """A question and a medium prose answer; in training, sometimes after an earlier turn."""
    exchange = _draw(rng, split, _chat_exchange)
    conversation = _single_turn("chat", rng, split, exchange)
    if split == "train" and rng.random() < 0.15:
        earlier = _draw(rng, split, _chat_exchange)
        history = [
            {"role": "user", "content": earlier.request},
            {"role": "assistant", "content": earlier.answer},
        ]
        first_user = next(i for i, m in enumerate(conversation.messages) if m["role"] == "user")
        messages = conversation.messages
        conversation = Conversation(
            "chat",
            messages[:first_user] + history + messages[first_user:],
            thinking=conversation.thinking,
        )
    return conversation


# ---------------------------------------------------------------------------------------------
# Assembly

THINKING_OFF_SHARE = 0.05  # training replies that skip reasoning because the prompt switched it off


def without_thinking(conversation: Conversation) -> Conversation:
    """The same conversation with reasoning switched off: the reply keeps only its answer."""
    reply = dict(conversation.reply, reasoning_content="")
    return Conversation(
        conversation.kind, conversation.prompt + [reply], conversation.tools, thinking=False
    )


KIND_SHARES = {"function_calling": 0.45, "code": 0.25, "chat": 0.3}
GENERATORS: dict[str, Callable[[random.Random, str], Conversation]] = {
    "function_calling": function_calling,
    "code": code,
    "chat": chat,
}


def training_corpus(size: int, seed: int) -> list[Conversation]:
    """`size` training conversations, mixed by KIND_SHARES; the same seed gives the same list."""
    rng = random.Random(seed)
    kinds = rng.choices(tuple(KIND_SHARES), weights=tuple(KIND_SHARES.values()), k=size)
    conversations = []
    for kind in kinds:
        conversation = GENERATORS[kind](rng, "train")
        if rng.random() < THINKING_OFF_SHARE:
            conversation = without_thinking(conversation)
        conversations.append(conversation)
    return conversations


DEMO_SEED = 1


def demo_conversations(
    per_source: int = 40, seed: int = DEMO_SEED
) -> dict[str, list[Conversation]]:
    """Held-out conversations for each demo prompt file, shaped as its source adapter reads it.

    Three Glaive rows in five are a bare request (the reply is a tool call), two a request whose
    tool already returned (the reply is the answer); code comes as instructions
    (OpenCodeInstruct) and as problem statements (Magicoder); chat is single-turn (ShareGPT).
    """
    rng = random.Random(seed)
    return {
        "glaive_fc": [
            function_calling(rng, "demo", with_result=i % 5 >= 3) for i in range(per_source)
        ],
        "opencodeinstruct": [code(rng, "demo", "instruction") for _ in range(per_source)],
        "magicoder": [code(rng, "demo", "problem") for _ in range(per_source)],
        "sharegpt": [chat(rng, "demo") for _ in range(per_source)],
    }
