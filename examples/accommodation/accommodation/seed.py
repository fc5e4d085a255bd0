"""Seed the demo database with believable student lets."""

import datetime
import random
import sqlite3

AREAS = (
    'Burley', 'City Centre', 'Headingley', 'Hyde Park', 'Kirkstall',
    'Little London', 'Meanwood', 'Woodhouse',
)  # fmt: skip
STREETS = (
    'Ash Road', 'Brudenell Grove', 'Cardigan Lane', 'Delph Lane',
    'Estcourt Avenue', 'Headingley Mount', 'Kelso Gardens', 'Manor Drive',
    'Royal Park Terrace', 'Victoria Road',
)  # fmt: skip
SCHEMA = """
CREATE TABLE property (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    area TEXT NOT NULL,
    rent INTEGER NOT NULL,
    rooms INTEGER NOT NULL,
    available TEXT NOT NULL,
    description TEXT NOT NULL
);
CREATE INDEX property_search ON property (area, rent);
"""


def properties(count, seed=2002):
    """``count`` rows for the property table, the same ones every time."""
    rng = random.Random(seed)
    start = datetime.date(2026, 6, 1)
    for id in range(1, count + 1):
        rooms = rng.choice((1, 1, 2, 3, 3, 4, 4, 5, 6))
        area = rng.choice(AREAS)
        street = rng.choice(STREETS)
        rent = rng.randrange(60, 160) + 5 * rooms
        available = start + datetime.timedelta(days=rng.randrange(0, 180))
        title = f'{rooms} bed, {rng.randrange(1, 200)} {street}'
        description = (
            f'A {rooms}-bedroom student house in {area}, '
            f'£{rent} per person per week.'
        )
        yield (
            id,
            title,
            area,
            rent,
            rooms,
            available.isoformat(),
            description,
        )


def seed(path, count):
    """Create ``path`` as a SQLite database holding ``count`` properties."""
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.executescript(SCHEMA)
            connection.executemany(
                'INSERT INTO property VALUES (?, ?, ?, ?, ?, ?, ?)',
                properties(count),
            )
    finally:
        connection.close()
