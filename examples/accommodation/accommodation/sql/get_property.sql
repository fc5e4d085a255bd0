-- cache_time: 60
-- max_rows: 1
SELECT id, title, area, rent, rooms, available, description
  FROM property
 WHERE id = :id
