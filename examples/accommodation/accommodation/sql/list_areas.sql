-- The areas, for the search form: they change only when properties do.
-- cache_time: 300
SELECT area, count(*) AS properties, min(rent) AS cheapest
  FROM property
 GROUP BY area
 ORDER BY area
