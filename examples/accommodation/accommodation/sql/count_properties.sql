-- How many properties match a search (the page shows the first 50).
-- cache_time: 30
SELECT count(*) AS matches
  FROM property
 WHERE area = :area
   AND rent <= :max_rent
   AND rooms >= :min_rooms
   AND available <= :available
