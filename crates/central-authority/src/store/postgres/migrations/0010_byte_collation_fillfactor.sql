-- Version 10: the histories' indexed text compared as bytes, whatever
-- the database's locale: in a database created with C.UTF-8 (Debian's
-- cluster in a container) each comparison went through strcoll, and a
-- transition's lookups and index inserts cost about 35 % more than with
-- "C". For UTF-8 text the order is the same.
ALTER TABLE health_events
    ALTER COLUMN host TYPE TEXT COLLATE "C",
    ALTER COLUMN segment TYPE TEXT COLLATE "C";
ALTER TABLE health_latest
    ALTER COLUMN host TYPE TEXT COLLATE "C",
    ALTER COLUMN connector TYPE TEXT COLLATE "C",
    ALTER COLUMN segment TYPE TEXT COLLATE "C",
    ALTER COLUMN protocol TYPE TEXT COLLATE "C";
ALTER TABLE address_events
    ALTER COLUMN host TYPE TEXT COLLATE "C",
    ALTER COLUMN address TYPE TEXT COLLATE "C";
ALTER TABLE address_latest
    ALTER COLUMN host TYPE TEXT COLLATE "C",
    ALTER COLUMN address TYPE TEXT COLLATE "C",
    ALTER COLUMN segment TYPE TEXT COLLATE "C",
    ALTER COLUMN protocol TYPE TEXT COLLATE "C";
-- Half of every page of the latest tables left free, so that a
-- transition's new version of a row fits on the row's own page: a HOT
-- update, which adds no entry to the five-column primary key. With full
-- pages most updates moved their row and inserted a key (41 % HOT over
-- psql batches of 1,000 flips, 99 % now; 10.7 -> 6.3 us per update).
-- CLUSTER rewrites the rows already there with the free space.
ALTER TABLE health_latest SET (fillfactor = 50);
ALTER TABLE address_latest SET (fillfactor = 50);
CLUSTER health_latest USING health_latest_pkey;
CLUSTER address_latest USING address_latest_pkey;
