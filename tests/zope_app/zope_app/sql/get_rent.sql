-- cache_time: 60
SELECT id, rent FROM property WHERE id = :id
