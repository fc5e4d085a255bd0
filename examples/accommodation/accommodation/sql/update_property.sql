-- The admin's update: a new rent and availability date.
UPDATE property
   SET rent = :rent, available = :available
 WHERE id = :id
