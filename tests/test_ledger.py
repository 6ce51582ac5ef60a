"""The ledger of a consumer's claims (`transport.receiving.ledger`): a batch's range cut into the
pieces it is read by and an acknowledgement settles, each a prepared claim's or the claim table's."""

from __future__ import annotations

from spark_qtransport.transport.receiving.ledger import Ledger, Piece
from spark_qtransport.transport.receiving.prepared import PreparedClaim

B = 2**62


def claim(first: int, last: int, table: str = "16384") -> PreparedClaim:
    return PreparedClaim(table, first, last, 1000 + first - B, 1000 + last - B, "20261203000000000000", "c")


def test_without_prepared_claims_a_batch_is_one_claim_table_piece() -> None:
    ledger = Ledger()
    assert ledger.pieces("16384", 10, 50) == [Piece(10, 50, None)]
    assert ledger.pieces("16384", 50, 50) == []


def test_prepared_claims_are_pieces_of_their_own_and_the_table_only_where_its_span_may_hold_claims() -> None:
    ledger = Ledger()
    a, b = claim(B + 1, B + 100), claim(B + 101, B + 200)
    ledger.claimed_prepared(a)
    ledger.claimed_prepared(b)
    assert ledger.pieces("16384", B, B + 200) == [Piece(B, B + 100, a), Piece(B + 100, B + 200, b)]
    assert ledger.pieces("16384", B + 50, B + 150) == [Piece(B + 50, B + 100, a), Piece(B + 100, B + 150, b)]
    ledger.parking(a)  # its rows move into the claim table with their numbers
    ledger.parked(a)
    assert ledger.pieces("16384", B, B + 200) == [Piece(B, B + 100, None), Piece(B + 100, B + 200, b)]


def test_claims_of_another_claim_table_are_not_pieces_of_this_one() -> None:
    ledger = Ledger()
    ledger.claimed_prepared(claim(B + 1, B + 100, table="16000"))
    ledger.claimed_in_table(5, 8)
    assert ledger.pieces("16384", 0, B + 100) == [Piece(0, B + 100, None)]


def test_an_acknowledgement_settles_the_claim_table_first_then_each_prepared_claim_up_to_its_end() -> None:
    ledger = Ledger()
    a, b = claim(B + 101, B + 200), claim(B + 201, B + 300)
    ledger.claimed_in_table(B + 1, B + 100)  # a retry acknowledgement's or a parked claim's
    ledger.claimed_prepared(a)
    ledger.claimed_prepared(b)
    assert ledger.settled_by(B + 200, whole_table=False) == [Piece(B, B + 100, None), Piece(B + 100, B + 200, a)]
    ledger.acknowledged_table(B + 200)
    ledger.committed(a)
    assert ledger.settled_by(B + 200, whole_table=False) == []  # repeated: nothing left to settle
    assert ledger.settled_by(B + 300, whole_table=False) == [Piece(B + 200, B + 300, b)]


def test_a_run_without_prepared_claims_acknowledges_the_claim_table_even_where_the_ledger_knows_no_claim() -> None:
    ledger = Ledger()
    assert ledger.settled_by(50, whole_table=True) == [Piece(50, 50, None)]
    assert ledger.settled_by(50, whole_table=False) == []
    ledger.claimed_in_table(20, 80)
    assert ledger.settled_by(50, whole_table=True) == [Piece(19, 50, None)]
    ledger.acknowledged_table(50)
    assert ledger.settled_by(50, whole_table=True) == [Piece(50, 50, None)]
    assert ledger.settled_by(90, whole_table=True) == [Piece(50, 80, None)]
