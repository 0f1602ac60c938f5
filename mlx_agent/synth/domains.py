"""The vocabularies :mod:`.catalogues` builds tools from: one entry per domain, data only.

Each domain has nouns (``record`` nouns are things a user creates, changes and removes, with
an id; ``info`` nouns are things looked up or computed from the domain's key parameters),
the key parameters that identify what an ``info`` noun is about, and the domain's fields,
each a parameter name and a spec in a small language :func:`.catalogues.field_schema` reads:

- ``str:KIND`` a string of a kind (``city``, ``title``, ``text``, ``person``, ``query``,
  ``id``, ``path``, ``product``, ``company``, ``country``, ``phone``, ``word``);
- ``date``, ``datetime``, ``time``, ``email``, ``url``, ``uuid``, ``hostname``, ``ipv4``:
  strings with that ``format``;
- ``int:LO:HI[:UNIT]``, ``num:LO:HI[:UNIT]``: bounded numbers;
- ``enum:A|B|C``; ``bool``;
- ``list:SPEC`` (an array of that spec), ``obj:SHAPE`` (a nested object, see
  :data:`.catalogues.SHAPES`).

Written for this project from everyday vocabulary; nothing here comes from a benchmark.
"""

from __future__ import annotations

LANGS = "enum:en|fr|de|es|pt|it|nl|ja"
CURRENCIES = "enum:USD|EUR|GBP|JPY|CHF|CAD|AUD"

# name -> (record nouns, info nouns, key fields, other fields)
DOMAINS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], dict[str, str]]] = {
    "weather": ((), ("forecast", "air_quality", "uv_index", "pollen_count", "storm_warning",
                     "tide_table"), ("location",), {
        "location": "str:city", "units": "enum:metric|imperial|standard",
        "days": "int:1:14:days", "include_hourly": "bool", "language": LANGS,
        "date": "date"}),
    "calendar": (("calendar_entry", "meeting", "reminder", "room_booking"),
                 ("free_slot", "public_holiday"),
                 ("calendar_owner",), {
        "calendar_owner": "email", "title": "str:title", "start": "datetime",
        "duration_minutes": "int:5:480:minutes", "attendees": "list:email",
        "timezone": "enum:UTC|Europe/Paris|America/New_York|Asia/Tokyo|Australia/Sydney",
        "recurrence": "enum:none|daily|weekly|monthly", "window": "obj:window"}),
    "mail": (("email_draft", "mail_filter", "auto_reply", "contact"), ("inbox_summary",
                                                                     "unread_count"),
             ("mailbox",), {
        "mailbox": "email", "to": "email", "subject": "str:title", "body": "str:text",
        "cc": "list:email", "priority": "enum:low|normal|high",
        "folder": "enum:inbox|archive|sent|spam|drafts", "unread_only": "bool"}),
    "storage": (("document", "folder", "share_link", "backup_job"), ("storage_quota",
                                                                   "file_checksum"),
                ("path",), {
        "path": "str:path", "recursive": "bool", "max_depth": "int:1:10",
        "permission": "enum:read|comment|write|admin", "expires_in_days": "int:1:90:days",
        "format": "enum:pdf|docx|txt|md|odt"}),
    "banking": (("payment", "standing_order", "savings_goal", "budget"),
                ("account_balance", "currency_rate", "spending_breakdown"), ("account_number",), {
        "account_number": "str:id", "amount": "num:0.01:100000:currency units",
        "currency": CURRENCIES, "value_date": "date",
        "category": "enum:groceries|rent|travel|utilities|salary|leisure",
        "memo": "str:text", "payee": "str:person"}),
    "flights": (("flight_booking", "fare_alert", "seat_selection"), ("flight_schedule",
                                                                    "baggage_allowance",
                                                                    "airport_delay"),
                ("origin", "destination"), {
        "origin": "str:city", "destination": "str:city", "departure_date": "date",
        "passengers": "int:1:9", "cabin": "enum:economy|premium|business|first",
        "nonstop_only": "bool", "max_fare": "num:50:5000:currency units"}),
    "lodging": (("hotel_reservation", "guest_review", "late_checkout"), ("room_rate",
                                                                        "hotel_amenities"),
                ("city",), {
        "city": "str:city", "check_in": "date", "nights": "int:1:30:nights",
        "guests": "int:1:8", "room_type": "enum:single|double|twin|suite|family",
        "max_nightly_price": "num:20:2000:currency units", "breakfast": "bool"}),
    "dining": (("table_booking", "delivery_order", "saved_recipe"), ("menu", "nutrition_facts",
                                                                   "wait_time"),
               ("restaurant",), {
        "restaurant": "str:company", "cuisine": "enum:italian|thai|mexican|indian|japanese|"
        "lebanese|ethiopian", "party_size": "int:1:20", "arrival_time": "time",
        "dish": "str:product", "servings": "int:1:12",
        "diet": "enum:none|vegetarian|vegan|gluten_free|halal",
        "allergens": "list:enum:nuts|dairy|gluten|soy|eggs|shellfish"}),
    "shop": (("shopping_cart_item", "purchase_order", "return_request", "wishlist_entry"),
             ("price_history", "stock_level"), ("product_code",), {
        "product_code": "str:id", "quantity": "int:1:99", "size": "enum:XS|S|M|L|XL|XXL",
        "colour": "enum:black|white|navy|red|green|beige",
        "shipping_speed": "enum:standard|express|overnight", "coupon": "str:word",
        "ship_to": "obj:address"}),
    "music": (("playlist", "concert_ticket", "listening_session"), ("song_lyrics",
                                                                   "artist_biography",
                                                                   "chart_position"),
              ("artist",), {
        "artist": "str:person", "song_title": "str:title",
        "genre": "enum:rock|jazz|classical|hiphop|electronic|folk|reggae",
        "shuffle": "bool", "moods": "list:enum:calm|upbeat|dark|romantic|epic",
        "volume_percent": "int:0:100:percent", "release_year":
        "int:1950:2026"}),
    "cinema": (("movie_ticket", "watchlist_item", "screening_request"), ("showtimes",
                                                                        "film_synopsis",
                                                                        "subtitle_track"),
               ("film_title",), {
        "film_title": "str:title", "cinema_city": "str:city", "screen_format":
        "enum:standard|3d|imax|dolby", "seats": "int:1:10", "show_date": "date",
        "audio_language": LANGS, "min_rating": "num:0:10"}),
    "fitness": (("workout_session", "meal_entry", "medication_schedule", "sleep_goal"),
                ("step_total", "resting_heart_rate", "calorie_burn"), ("member_id",), {
        "member_id": "str:id", "activity": "enum:running|cycling|swimming|yoga|rowing|hiking",
        "duration_minutes": "int:5:300:minutes", "intensity": "enum:low|moderate|high",
        "distance_km": "num:0.1:200:km", "day": "date", "calories": "int:0:6000:kcal"}),
    "navigation": (("saved_place", "trip_plan"), ("driving_route", "travel_time",
                                                  "traffic_incident", "charging_point",
                                                  "parking_availability"),
                   ("start_point", "end_point"), {
        "start_point": "str:city", "end_point": "str:city",
        "travel_mode": "enum:driving|walking|cycling|transit", "avoid_tolls": "bool",
        "radius_meters": "int:100:50000:meters", "position": "obj:coordinates",
        "depart_at": "datetime"}),
    "home": (("light_scene", "thermostat_program", "door_code", "appliance_timer"),
             ("room_temperature", "energy_usage", "camera_snapshot"), ("room",), {
        "room": "enum:living_room|kitchen|bedroom|garage|office|hallway",
        "target_celsius": "num:5:35:celsius", "brightness_percent": "int:0:100:percent",
        "switch_on_at": "time", "weekdays": "list:enum:mon|tue|wed|thu|fri|sat|sun",
        "device_serial": "str:id", "away_mode": "bool"}),
    "devops": (("deployment", "incident", "dns_record", "alert_rule"), ("service_health",
                                                                       "error_rate",
                                                                       "build_log"),
               ("service_name",), {
        "service_name": "str:word", "environment": "enum:dev|staging|production",
        "region": "enum:us-east|us-west|eu-central|ap-south", "replicas": "int:1:64",
        "host": "hostname", "ip_address": "ipv4", "since": "datetime",
        "severity": "enum:info|warning|critical",
        "notify_channels": "list:enum:email|sms|chat|pager"}),
    "analytics": (("saved_report", "dashboard", "data_export", "scheduled_query"),
                  ("metric_series", "table_schema", "row_count"), ("dataset",), {
        "dataset": "str:word", "columns": "list:str:word", "filter_expression": "str:query",
        "aggregation": "enum:sum|avg|min|max|count|median", "from_date": "date",
        "to_date": "date", "export_format": "enum:csv|json|parquet|xlsx"}),
    "people": (("leave_request", "job_opening", "interview_slot", "expense_claim"),
               ("payslip", "vacation_balance", "org_chart"), ("employee_number",), {
        "employee_number": "str:id", "department": "enum:engineering|sales|finance|support|"
        "marketing|legal", "first_day": "date", "days": "int:1:30:days",
        "work_email": "email", "claim_amount": "num:1:20000:currency units"}),
    "school": (("course_enrollment", "assignment_submission", "study_group", "exam_booking"),
               ("grade_report", "course_catalog", "attendance_rate"), ("student_number",), {
        "student_number": "str:id", "course_code": "str:id", "due": "date",
        "score": "num:0:100:points", "term": "enum:autumn|spring|summer",
        "level": "enum:beginner|intermediate|advanced", "topics": "list:str:title"}),
    "sports": (("match_ticket", "fantasy_lineup", "training_booking"), ("league_standings",
                                                                       "player_statistics",
                                                                       "fixture_list",
                                                                       "live_score"),
               ("team",), {
        "team": "str:company", "competition": "enum:premier|laliga|seriea|bundesliga|"
        "ligue1|eredivisie", "season": "int:2000:2026", "match_day": "date",
        "player": "str:person", "home_only": "bool"}),
    "news": (("news_alert", "reading_list_entry", "topic_subscription"), ("headlines",
                                                                         "article_summary",
                                                                         "trending_topics"),
             ("news_topic",), {
        "news_topic": "enum:technology|science|business|politics|health|culture",
        "edition_country": "str:country", "language": LANGS, "published_after": "date",
        "max_items": "int:1:50", "keywords": "list:str:query",
        "sections": "list:enum:world|local|opinion|sport|weather"}),
    "language": (("glossary_term", "flashcard_deck"), ("translation", "language_detection",
                                                       "pronunciation_guide", "synonym_list",
                                                       "spelling_check"), ("phrase",), {
        "phrase": "str:text", "source_lang": LANGS, "target_lang": LANGS,
        "formality": "enum:formal|informal|neutral", "max_suggestions": "int:1:20"}),
    "math": ((), ("unit_conversion", "loan_repayment", "compound_interest", "tip_share",
                  "body_mass_index", "percentage_change"), ("quantity",), {
        "quantity": "num:0.01:1000000", "from_unit": "enum:km|mile|kg|lb|litre|gallon",
        "to_unit": "enum:km|mile|kg|lb|litre|gallon", "annual_rate_percent":
        "num:0:30:percent", "years": "int:1:40:years", "people": "int:1:20",
        "decimals": "int:0:6"}),
    "property": (("viewing_appointment", "rental_application", "saved_search"),
                 ("home_valuation", "rent_estimate", "neighbourhood_profile"), ("postcode",), {
        "postcode": "str:zip", "bedrooms": "int:0:8", "property_kind":
        "enum:apartment|house|condo|townhouse|studio", "max_budget":
        "num:100:5000000:currency units", "floor_area_m2": "num:10:1000:square meters",
        "furnished": "bool"}),
    "shipping": (("parcel_shipment", "courier_pickup", "customs_declaration"),
                 ("tracking_status", "delivery_quote", "warehouse_inventory"),
                 ("tracking_code",), {
        "tracking_code": "str:id", "weight_kg": "num:0.1:1000:kg", "destination_country":
        "str:country", "service_level": "enum:ground|air|express|economy",
        "sender_address": "obj:address", "insured_value": "num:0:50000:currency units"}),
    "helpdesk": (("support_ticket", "ticket_comment", "escalation", "callback_request"),
                 ("sla_status", "help_article", "queue_length"), ("customer_email",), {
        "customer_email": "email", "urgency": "enum:low|medium|high|urgent",
        "state": "enum:open|pending|resolved|closed", "message": "str:text",
        "assignee": "str:person", "phone_number": "str:phone"}),
    "projects": (("work_item", "milestone", "sprint", "time_entry"), ("burndown",
                                                                     "team_capacity",
                                                                     "project_risk"),
                 ("project_key",), {
        "project_key": "str:id", "owner": "str:person", "due_date": "date",
        "estimate_hours": "num:0.5:200:hours", "labels": "list:str:title",
        "stage": "enum:backlog|todo|in_progress|review|done"}),
    "pets": (("vet_visit", "vaccination", "pet_sitting", "feeding_plan"), ("breed_profile",
                                                                          "adoption_listing"),
             ("pet_name",), {
        "pet_name": "str:person", "species": "enum:dog|cat|rabbit|parrot|hamster|turtle",
        "age_years": "int:0:30:years", "weight_kg": "num:0.1:90:kg", "visit_date": "date",
        "clinic_city": "str:city"}),
    "vehicles": (("service_booking", "fuel_record", "car_rental", "parking_permit"),
                 ("recall_notice", "tyre_pressure", "vehicle_valuation"), ("plate_number",), {
        "plate_number": "str:id", "odometer_km": "int:0:900000:km", "fuel":
        "enum:petrol|diesel|electric|hybrid|lpg", "pickup_city": "str:city",
        "service_date": "date", "litres": "num:1:120:litres"}),
}
