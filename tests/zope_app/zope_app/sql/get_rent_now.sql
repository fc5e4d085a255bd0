-- cache_time: 0
SELECT rent, id FROM property WHERE id = :id
