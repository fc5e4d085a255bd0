-- The search that melted: properties in an area, under a rent, with
-- enough rooms, available by a date. Cheapest first.
-- cache_time: 30
-- max_rows: 50
SELECT id, title, area, rent, rooms, available
  FROM property
 WHERE area = :area
   AND rent <= :max_rent
   AND rooms >= :min_rooms
   AND available <= :available
 ORDER BY rent, id
