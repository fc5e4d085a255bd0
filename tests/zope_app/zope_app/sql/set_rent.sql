UPDATE property SET rent = :rent WHERE id = :id
