-- cache_time: 300
SELECT value FROM models WHERE name = :name
