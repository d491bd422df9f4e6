"""Names of the nodes and tensors onnx-remat adds."""

from onnx_remat.graph import tags


def test_clone_names_and_their_originals():
    assert tags.clone_name("/blocks.0/Div", "Div", 3) == "/blocks.0/Div/remat"
    assert tags.clone_name("/blocks.0/Div", "Div", 3, copy=2) == "/blocks.0/Div@2/remat"
    assert tags.clone_name("", "Div", 3) == "Div_3/remat"
    for copy in (1, 2, 11):
        name = tags.clone_name("/blocks.0/Div", "Div", 0, copy)
        assert tags.is_clone_name(name)
        assert tags.original_name(name) == "/blocks.0/Div"
        assert tags.original_name(tags.clone_tensor_name("a@b_output_0", copy)) == "a@b_output_0"
    assert tags.original_name("/blocks.0/Div") == "/blocks.0/Div"


def test_barrier_names():
    name = tags.barrier_name("blocks.3")
    assert tags.is_barrier_name(name) and tags.segment_of_name(name) == "blocks.3"
    assert tags.segment_of_name("/blocks.3/Div") is None
