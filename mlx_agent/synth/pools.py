"""Value pools for synthesised arguments, and the fixed rule that splits each into two sides.

A pool is a plain tuple of values of one kind (cities, people, file paths, ...). Every pool
and every integer is split by :func:`held_out_index`: index (or value) ``≡ 2 (mod 3)`` goes
to the held-out side, the rest to training. The rule does not depend on the seed, so a
training set made with one seed and a held-out set made with another still share no value.
This module holds data and that rule only; choosing a pool for a parameter is ``values.py``.
"""

from __future__ import annotations

TRAIN, HELDOUT = "train", "heldout"
SIDES = (TRAIN, HELDOUT)


def held_out_index(n: int) -> bool:
    """Whether the n-th pool entry (or the integer n) belongs to the held-out side."""
    return n % 3 == 2


def side_of(n: int) -> str:
    return HELDOUT if held_out_index(n) else TRAIN


def split(pool: tuple, side: str) -> tuple:
    """The entries of ``pool`` on ``side``."""
    return tuple(v for i, v in enumerate(pool) if side_of(i) == side)


CITIES = (
    "Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Denver", "Hanoi", "Dublin", "Quito",
    "Nairobi", "Porto", "Seoul", "Austin", "Perth", "Krakow", "Bogota", "Osaka", "Accra",
    "Tallinn", "Montreal", "Jakarta", "Seville", "Tunis", "Helsinki", "Santiago", "Mumbai",
    "Zurich", "Havana", "Manila", "Lisbon", "Boston", "Kyoto", "Dakar", "Vienna", "Calgary",
    "Prague", "Chennai", "Auckland", "Marseille", "Riga", "Phoenix", "Valencia", "Busan",
    "Glasgow")
COUNTRIES = (
    "France", "Japan", "Kenya", "Peru", "Norway", "Egypt", "Canada", "Vietnam", "Ireland",
    "Ecuador", "Portugal", "Chile", "India", "Poland", "Ghana", "Estonia", "Spain", "Tunisia",
    "Finland", "Mexico", "Austria", "Iceland", "Morocco", "Brazil", "Greece", "Nepal", "Uruguay",
    "Denmark", "Senegal", "Latvia")
# Places as a "city and state" or "city and country" parameter wants them (OpenAI's own
# example tool asks for "The city and state, e.g. San Francisco, CA"): the value is copied
# whole, comma and all, from a request that says it so
STATE_PLACES = (
    "Denver, CO", "Austin, TX", "Tacoma, WA", "Salem, OR", "Tulsa, OK", "Reno, NV",
    "Madison, WI", "Boise, ID", "Dayton, OH", "Mobile, AL", "Eugene, OR", "Provo, UT",
    "Duluth, MN", "Savannah, GA", "Albany, NY", "Fresno, CA", "Omaha, NE", "Tampa, FL",
    "Helena, MT", "Akron, OH", "Wichita, KS", "Raleigh, NC", "Bangor, ME", "Tucson, AZ")
COUNTRY_PLACES = (
    "Porto, Portugal", "Tallinn, Estonia", "Cusco, Peru", "Bergen, Norway", "Luxor, Egypt",
    "Hue, Vietnam", "Cork, Ireland", "Cuenca, Ecuador", "Valparaiso, Chile", "Pune, India",
    "Gdansk, Poland", "Kumasi, Ghana", "Tartu, Estonia", "Bilbao, Spain", "Sousse, Tunisia",
    "Tampere, Finland", "Oaxaca, Mexico", "Graz, Austria", "Akureyri, Iceland",
    "Fez, Morocco", "Recife, Brazil", "Patras, Greece", "Pokhara, Nepal", "Aarhus, Denmark")
# the examples a generated description gives (never a value, so no call copies one)
PLACE_EXAMPLES = {"state": ("Springfield, IL", "Portland, ME", "Dover, DE"),
                  "country": ("Lyon, France", "Sapporo, Japan", "Mombasa, Kenya")}
PEOPLE = (
    "Alice Moreau", "Bilal Khan", "Chen Wei", "Dana Ortiz", "Emeka Obi", "Freya Lund",
    "Gustavo Reyes", "Hana Sato", "Ivan Petrov", "Jonas Berg", "Keiko Mori", "Liam Walsh",
    "Maya Cohen", "Nadia Haddad", "Oscar Lindqvist", "Priya Nair", "Quentin Roy", "Rosa Diaz",
    "Samir Aziz", "Tara Quinn", "Umar Farouk", "Vera Novak", "Wen Liu", "Ximena Cruz",
    "Yusuf Demir", "Zoe Martin", "Arjun Mehta", "Bea Santos", "Carlos Vega", "Daria Volkova",
    "Elif Kaya", "Farid Rahimi", "Greta Vogel", "Hugo Laurent", "Ines Duarte", "Jamal Reed")
DOMAINS = ("example.com", "example.org", "mail.example.net")
DIRS = ("notes", "src", "docs", "data", "reports", "config", "scripts", "logs", "assets",
        "tests", "drafts", "archive")
FILES = (
    "todo.txt", "main.py", "guide.md", "budget.csv", "summary.txt", "settings.yaml",
    "deploy.sh", "errors.log", "logo.svg", "test_api.py", "letter.md", "2023.tar.gz",
    "ideas.txt", "utils.py", "faq.md", "sales.csv", "minutes.txt", "app.toml", "build.sh",
    "access.log", "photo.png", "test_db.py", "essay.md", "backup.zip", "plan.txt",
    "parser.py", "howto.md", "inventory.csv", "recap.txt", "env.json")
SITES = ("docs.example.com", "shop.example.org", "blog.example.net", "api.example.com",
         "news.example.org", "wiki.example.net")
URL_PATHS = (
    "pricing", "about", "guides/setup", "v2/status", "posts/42", "faq", "careers",
    "reports/q3", "help/billing", "changelog", "events/2024", "team", "store/sale",
    "docs/intro", "press", "contact", "download", "blog/launch", "status", "terms",
    "privacy", "partners", "api/limits", "jobs/remote")
TITLES = (
    "Quarterly review", "Launch plan", "Team offsite", "Budget update", "Hiring sync",
    "Release notes", "Incident recap", "Design review", "Weekly digest", "Roadmap draft",
    "Vendor contract", "Onboarding checklist", "Travel plans", "Board meeting",
    "Customer feedback", "Security audit", "Lunch and learn", "Sprint retro",
    "Product demo", "Holiday schedule", "Office move", "Migration plan", "Code freeze",
    "Partner call", "Year in review", "Support rota", "Pricing change")
SENTENCES = (
    "The meeting moved to Thursday", "Please review the attached draft",
    "Remember to water the plants", "The build passed on the second try",
    "Lunch is on me today", "Call the landlord about the heater",
    "The shipment arrives next week", "Bring the projector cables",
    "Thanks for covering my shift", "The report needs two more charts",
    "Pick up the dry cleaning", "Our flight lands at noon",
    "The printer on floor two is jammed", "Send the slides before the call",
    "The demo went really well", "Book the small room for Friday",
    "Renew the parking permit", "The cat needs her vaccine",
    "Dinner is at the usual place", "Check the server logs tonight",
    "Order more coffee beans", "The invoice was paid yesterday",
    "Back up the laptop before the trip", "The garden party is cancelled",
    "Ask for the updated contract", "Fix the typo on the homepage",
    "The train was twenty minutes late")
QUERIES = (
    "best hiking trails", "sourdough starter tips", "electric bike reviews",
    "how to tie a bowline", "cheap flights in spring", "python asyncio tutorial",
    "history of the printing press", "vegan lasagna recipe", "noise cancelling headphones",
    "learn to juggle", "solar panel efficiency", "remote work tools",
    "beginner chess openings", "indoor plants low light", "marathon training plan",
    "budget travel backpack", "home espresso machine", "stargazing apps",
    "kids science experiments", "rust borrow checker", "knitting for beginners",
    "weekend road trips", "photo editing software", "sleep hygiene habits")
WORDS = (
    "amber", "falcon", "harbor", "meadow", "quartz", "willow", "cobalt", "ember", "glacier",
    "juniper", "lantern", "nebula", "orchid", "pepper", "raven", "saffron", "timber",
    "velvet", "walnut", "zephyr", "basil", "copper", "dune", "fern", "granite", "hazel",
    "indigo", "jasper", "kelp", "lotus")
LANGUAGES = ("French", "Japanese", "Swahili", "Spanish", "German", "Korean", "Italian",
             "Hindi", "Portuguese", "Dutch", "Turkish", "Polish", "Greek", "Thai", "Arabic")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF", "CAD", "AUD", "SEK", "NOK", "INR", "BRL",
              "MXN", "ZAR", "KRW", "NZD")
COMPANIES = ("Acme Corp", "Globex", "Initech", "Umbrella Labs", "Stark Works", "Wayne Foods",
             "Hooli", "Vandelay Imports", "Soylent Co", "Cyberdyne", "Tyrell Systems",
             "Wonka Sweets", "Oceanic Air", "Pied Piper", "Monarch Paper")
PRODUCTS = ("desk lamp", "wireless mouse", "yoga mat", "water bottle", "running shoes",
            "coffee grinder", "backpack", "monitor stand", "notebook", "tea kettle",
            "phone case", "bike helmet", "rain jacket", "table fan", "travel mug",
            "keyboard", "sunglasses", "pillow", "camera strap", "plant pot")
STREETS = ("Maple Street", "Harbor Road", "Station Lane", "Oak Avenue", "Mill Road",
           "Park Terrace", "Church Street", "River Walk", "Hill Crescent", "Elm Drive",
           "Bridge Street", "Garden Row")
COMMANDS = ("ls -la", "git status", "df -h", "uptime", "whoami", "date", "pwd",
            "git log --oneline", "du -sh .", "uname -a", "python --version", "env")
COLORS = ("red", "teal", "navy", "olive", "coral", "violet", "maroon", "beige", "silver",
          "lime", "plum", "ochre")
ID_PREFIXES = ("A", "X", "K", "R", "T", "M")
# (unit word as a parameter name or description says it, how a request says it)
UNITS = (("kg", "kg"), ("kilogram", "kg"), ("gram", "g"), ("km", "km"), ("kilometer", "km"),
         ("mile", "miles"), ("meter", "m"), ("second", "seconds"), ("minute", "minutes"),
         ("hour", "hours"), ("day", "days"), ("celsius", "°C"), ("fahrenheit", "°F"),
         ("percent", "%"), ("dollar", "dollars"), ("euro", "euros"), ("liter", "liters"),
         ("ms", "ms"), ("byte", "bytes"), ("mb", "MB"), ("gb", "GB"))
STRING_UNITS = ("kg", "km", "g", "ml", "lb", "cm", "miles", "liters")

# Requests that no tool answers: chit-chat and general knowledge. Topics are split like the
# pools; templates are split by family in phrasing.py.
TOPICS = (
    "penguins", "volcanoes", "the moon", "honeybees", "octopuses", "glaciers", "owls",
    "the Roman Empire", "rainbows", "jazz", "origami", "lighthouses", "dinosaurs", "tea",
    "chess", "the ocean", "bamboo", "comets", "dolphins", "castles", "kites", "mushrooms",
    "the Sahara", "hummingbirds", "pyramids", "coral reefs", "violins", "autumn leaves",
    "sunflowers", "submarines", "the alphabet", "snowflakes", "giraffes")
ADJECTIVES = ("brave", "quiet", "ancient", "generous", "fragile", "clumsy", "gentle",
              "bright", "stubborn", "humble", "eager", "vivid", "calm", "witty", "fierce",
              "tidy", "curious", "loyal")
